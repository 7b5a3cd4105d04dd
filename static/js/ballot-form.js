// The ballot settings of the admin's poll forms (create and edit): fields of
// one kind show only for it, the body's ballot fields, and the server's 422
// `invalid_ballot_settings` under the field it names.

const NAMES = ["max_choices", "votes_per_user", "max_per_option", "allow_change", "ballot", "results"];

const LABELS = {
  max_choices: "“Most choices on one ballot”",
  votes_per_user: "“Votes per voter”",
  max_per_option: "“Most votes on one option”",
  allow_change: "“Voters may change their vote”",
  ballot: "“How people vote”",
};

/** Shows each `[data-for-kinds]` field only for the kinds it lists. */
export function ballotFields(form) {
  const f = form.elements;
  if (!f.ballot) return null;
  const parts = [...form.querySelectorAll("[data-for-kinds]")];
  const show = () => {
    for (const part of parts) part.hidden = !part.dataset.forKinds.split(" ").includes(f.ballot.value);
  };
  f.ballot.addEventListener("change", show);
  show();
  const number = (name) => (f[name].value.trim() === "" ? null : Number(f[name].value));
  const api = {
    show,
    /** The settings as the form has them, as the API takes them. */
    values() {
      const kind = f.ballot.value;
      const body = { ballot: kind };
      // An empty "most" field is sent as null: every option, or the whole budget
      // (in an edit too, where a field left out would keep the old number).
      if (kind === "multi" || kind === "ranked") body.max_choices = number("max_choices");
      if (kind === "budget") {
        if (number("votes_per_user") !== null) body.votes_per_user = number("votes_per_user");
        body.max_per_option = number("max_per_option");
      } else {
        body.allow_change = f.allow_change.checked;
      }
      return body;
    },
    /** Field errors the browser can tell before sending. */
    check() {
      const errors = {};
      const kind = f.ballot.value;
      const whole = (name, lo, hi) => {
        const n = number(name);
        if (n !== null && !(Number.isInteger(n) && n >= lo && n <= hi)) errors[name] = `Enter a whole number from ${lo} to ${hi}.`;
      };
      if (kind === "budget") {
        if (number("votes_per_user") === null) errors.votes_per_user = "A budget needs the number of votes each voter gets.";
        else whole("votes_per_user", 1, 1000);
        whole("max_per_option", 1, number("votes_per_user") || 1000);
      } else if (kind !== "single") {
        whole("max_choices", 1, 1000);
      }
      return errors;
    },
    reset() {
      f.ballot.value = "single";
      for (const name of ["max_choices", "votes_per_user", "max_per_option"]) f[name].value = "";
      f.allow_change.checked = false;
      show();
    },
  };
  return api;
}

/**
 * A 422 `invalid_ballot_settings`, as `{field: words}`: the field the server's
 * message names first, and the message with the fields' labels for their names.
 */
export function ballotRefusal(message) {
  const text = String(message || "");
  const at = NAMES.map((name) => [name, text.indexOf(name)]).filter(([, i]) => i >= 0);
  at.sort((a, b) => a[1] - b[1]);
  const where = at.length ? at[0][0] : "ballot";
  if (where === "results") return { results: "Pick who sees the results, and when." };
  // One pass over every setting's name, so that a label put in is not rewritten
  // by the next name; "ballot" only as the setting ("ballot must be one of ..."),
  // not the word ("a budget ballot needs ...").
  const names = new RegExp(`\\b(${Object.keys(LABELS).filter((n) => n !== "ballot").join("|")})\\b`, "g");
  let words = text.replace(names, (name) => LABELS[name]).replace(/^ballot must/, `${LABELS.ballot} must`);
  words = words.charAt(0).toUpperCase() + words.slice(1);
  return { [where]: words.endsWith(".") ? words : `${words}.` };
}
