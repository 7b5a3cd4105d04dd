// Times and durations as the pages show them, and the server's clock.

// With the zone's short name ("PST", "GMT+1"): a time without its zone is a guess.
const shortDate = { month: "short", day: "numeric", hour: "numeric", minute: "2-digit", timeZoneName: "short" };
const sameYear = new Intl.DateTimeFormat(undefined, shortDate);
const otherYear = new Intl.DateTimeFormat(undefined, { ...shortDate, year: "numeric" });

/** The visitor's time zone's short name at `date` ("PST", "GMT+1"), as `localTime` names it. */
export function zoneName(date = new Date()) {
  return sameYear.formatToParts(date).find((part) => part.type === "timeZoneName")?.value || "";
}

const withSeconds = new Intl.DateTimeFormat(undefined, { ...shortDate, second: "2-digit" });
const withSecondsOtherYear = new Intl.DateTimeFormat(undefined, { ...shortDate, second: "2-digit", year: "numeric" });

/** "Nov 22, 3:09 PM PST" in the visitor's time zone; the year only when not this one. */
export function localTime(date, seconds = false) {
  const thisYear = date.getFullYear() === new Date().getFullYear();
  if (seconds) return (thisYear ? withSeconds : withSecondsOtherYear).format(date);
  return (thisYear ? sameYear : otherYear).format(date);
}

const clock = new Intl.DateTimeFormat(undefined, { hour: "numeric", minute: "2-digit" });

/** "3:09 PM" (or "15:09"): the time of day only, in the visitor's time zone. */
export function clockTime(date) {
  return clock.format(date);
}

const utc = new Intl.DateTimeFormat("en-GB", {
  year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit",
  timeZone: "UTC", timeZoneName: "short",
});

/** "26 Nov 2026, 05:00:00 UTC": the same moment in UTC (shown on hover). */
export function utcTime(date) {
  return utc.format(date);
}

/** A `datetime-local` value: the date's wall time in the visitor's time zone. */
export function toLocalInput(date) {
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T${pad(date.getHours())}:${pad(date.getMinutes())}`;
}

/** "1d 02:03:04", "02:03:04" or "03:04". */
export function formatDuration(ms) {
  let s = Math.max(0, Math.ceil(ms / 1000));
  const days = Math.floor(s / 86400);
  s -= days * 86400;
  const h = Math.floor(s / 3600);
  s -= h * 3600;
  const m = Math.floor(s / 60);
  s -= m * 60;
  const pad = (n) => String(n).padStart(2, "0");
  const clock = h > 0 || days > 0 ? `${pad(h)}:${pad(m)}:${pad(s)}` : `${pad(m)}:${pad(s)}`;
  return days > 0 ? `${days}d ${clock}` : clock;
}

/**
 * Server time minus client time. The server stamped `serverNow` just before
 * answering, so compare it with the moment the page's response began arriving.
 */
export function clockOffset(serverNow) {
  let received = Date.now();
  const nav = performance.getEntriesByType ? performance.getEntriesByType("navigation")[0] : null;
  if (nav && nav.responseStart > 0 && performance.timeOrigin) {
    received = performance.timeOrigin + nav.responseStart;
  }
  return serverNow - received;
}
