// What the admin's sale forms share (the new sale on the admin page, the edit on
// a sale's admin page): reading prices and units, and the API's refusals in
// plain words under the field they are about.

export const MAX_PAYMENT_WINDOW_S = 86400;
export const PAYMENT_WINDOW_HINT = "Enter whole seconds from 0 (no payment step) to 86,400 (a day).";
export const MAX_PER_USER = 100;
export const MAX_PER_USER_HINT = "Enter a whole number from 1 to 100.";
export const MAX_ADMIT_PER_SECOND = 100000;
export const ADMIT_RATE_HINT = "Enter a whole number from 1 to 100,000.";
export const QUEUE_OPENS_HINT = "The line must open at or before the sale opens.";
export const CLAIM_WINDOW_HINT = "Enter whole seconds from 60 to 86,400 (a day).";
export const ENTRIES_OPEN_HINT = "Entries must open before the draw (the opening).";
export const NO_DRAW_ROOM = "A draw has no waiting room: untick the waiting room or sell first come.";
export const PROOF_HINT = "Enter a whole number from 0 (off) to 24.";
export const PROOF_NEEDS = "A proof of work is asked with a ticket, the waiting room or a draw entry: require a ticket, or choose one of those.";
export const ACCOUNT_AGE_HINT = "Enter whole seconds from 0 (any account) to 31,622,400 (366 days).";
export const IMAGE_HINT = "Use an https:// address or a path on this site starting with /, without spaces or quotes.";

/** "19.99" -> 1999; null when it is not a price. */
export function parsePrice(text) {
  const m = /^\s*(\d{1,9})(?:[.,](\d{1,2}))?\s*$/.exec(text);
  if (!m) return null;
  return Number(m[1]) * 100 + Number((m[2] || "0").padEnd(2, "0"));
}

export function parseUnits(text) {
  return /^\s*\d{1,9}\s*$/.test(text) ? Number(text) : null;
}

/** The API's refusal, in plain words under the field it is about; null for others. */
export function refusalOf(res) {
  const message = String(res.data.message || "");
  switch (res.data.error) {
    case "invalid_window":
      if (message.includes("past")) return { ends_at: "The end is in the past: pick a later time." };
      if (message.includes("at most")) return { ends_at: "A sale can last at most 366 days." };
      return { ends_at: "The sale must end after it opens." };
    case "invalid_text":
      if (message.startsWith("description")) return { description: "The description can have at most 5,000 characters." };
      return { name: "Give the sale a name of at most 200 characters." };
    case "invalid_price":
      return { price: "Enter a price from 0 up, like 499 or 19.99." };
    case "invalid_image_url":
      return { image_url: IMAGE_HINT };
    case "invalid_payment_window":
      return { payment_window_s: PAYMENT_WINDOW_HINT };
    case "invalid_quantity":
      return { max_per_user: MAX_PER_USER_HINT };
    case "invalid_waiting_room":
      if (message.includes("admit_per_second must") || message.includes("needs admit_per_second")) return { admit_per_second: ADMIT_RATE_HINT };
      if (message.includes("needs queue_opens_at")) return { queue_opens_at: "Pick when the line opens." };
      if (message.includes("queue_opens_at")) return { queue_opens_at: QUEUE_OPENS_HINT };
      // An edit that keeps the waiting room but drops the ticket.
      if (message.includes("requires a ticket")) return { waiting_room: "A sale with a waiting room requires a purchase ticket." };
      return null;
    case "invalid_draw":
      if (message.includes("waiting room")) return { mode: NO_DRAW_ROOM };
      if (message.includes("claim_window_s")) return { claim_window_s: CLAIM_WINDOW_HINT };
      if (message.includes("needs entries_open_at")) return { entries_open_at: "Pick when entries open." };
      if (message.includes("after entries_open_at")) return { entries_open_at: ENTRIES_OPEN_HINT };
      if (message.includes("needs draw_at")) return { starts_at: "Pick when the draw is made." };
      return null;
    case "invalid_fairness":
      if (message.startsWith("min_account_age_s")) return { min_account_age_s: ACCOUNT_AGE_HINT };
      if (message.startsWith("proof_of_work must")) return { proof_of_work: PROOF_HINT };
      if (message.startsWith("proof_of_work")) return { proof_of_work: PROOF_NEEDS };
      return null;
    case "invalid_stock":
    case "stock_too_large":
      return { stock: "The stock can be 0 to 10,000,000 units." };
    default:
      return null;
  }
}
