// What a shopper whose order was returned (cancelled, refunded, expired) reads.

/**
 * What a shopper whose order was returned reads on the sale page: how it ended,
 * and whether they may buy again (the sale's one rule for cancelled, refunded and
 * expired orders; on a sale of more than one per customer, `maxPerUser`, returned
 * units count toward its limit). `gate`: "line" or "draw" on a sale with a waiting
 * room or a draw, whose admission or win the purchase used.
 */
export function returnedWords(returned, mayRebuy, maxPerUser = 1, gate = null) {
  const ended = {
    cancelled_by_you: "You cancelled your order",
    cancelled: "Your order was cancelled",
    refunded: "Your order was cancelled and refunded",
    expired: "Your order expired unpaid",
  }[returned] || "Your order was cancelled";
  // A waiting room's admission and a draw's win buy once, whatever the sale's
  // rule: the purchase used it, and a returned order gives no second one.
  if (gate) return [`${ended}.`, `${gate === "draw" ? "A win" : "A turn in the line"} buys once: a returned order does not give another.`];
  if (mayRebuy) return [`${ended}; you may buy again.`, ""];
  if (maxPerUser > 1) return [`${ended}.`, `Returned units still count toward this sale's limit of ${maxPerUser} per customer.`];
  return [`${ended}.`, "This sale allows one purchase per customer, cancelled or not."];
}
