// Numbers as the server writes them (src/web/view/text.rs), for values updated live.

/** Same format as the server's `group_digits`: 1234567 -> "1,234,567". */
export function groupDigits(n) {
  const sign = n < 0 ? "-" : "";
  return sign + Math.floor(Math.abs(n)).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}

/** Same format as the server's `format_price`: $1,234.50. */
export function formatPrice(cents) {
  const sign = cents < 0 ? "-" : "";
  const abs = Math.abs(cents);
  return `${sign}$${groupDigits(abs / 100)}.${String(abs % 100).padStart(2, "0")}`;
}
