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

/**
 * Same as the server's `shares` (src/web/view/text.rs): whole percentages of
 * `total`, adding up to 100 when the votes add up to `total` (largest remainders,
 * the earlier option first on a tie), else each rounded on its own.
 */
export function shares(votes, total) {
  const vs = votes.map((v) => Math.max(0, Number(v) || 0));
  const counted = vs.reduce((a, b) => a + b, 0);
  if (total <= 0 || counted !== total) return vs.map((v) => (total > 0 ? Math.floor((v * 200 + total) / (2 * total)) : 0));
  const out = vs.map((v) => Math.floor((v * 100) / total));
  let left = 100 - out.reduce((a, b) => a + b, 0);
  const order = vs.map((_, i) => i).sort((a, b) => ((vs[b] * 100) % total) - ((vs[a] * 100) % total) || a - b);
  for (const i of order) {
    if (left <= 0) break;
    out[i] += 1;
    left -= 1;
  }
  return out;
}
