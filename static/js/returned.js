// What a shopper whose order was returned (cancelled, refunded, expired) reads.

/**
 * What a shopper whose order was returned reads on the sale page: how it ended,
 * and whether they may buy again (the sale's one rule for cancelled, refunded and
 * expired orders; on a sale of more than one per customer, `maxPerUser`, returned
 * units count toward its limit).
 */
export function returnedWords(returned, mayRebuy, maxPerUser = 1) {
  const ended = {
    cancelled_by_you: "You cancelled your order",
    cancelled: "Your order was cancelled",
    refunded: "Your order was cancelled and refunded",
    expired: "Your order expired unpaid",
  }[returned] || "Your order was cancelled";
  if (mayRebuy) return [`${ended}; you may buy again.`, ""];
  if (maxPerUser > 1) return [`${ended}.`, `Returned units still count toward this sale's limit of ${maxPerUser} per customer.`];
  return [`${ended}.`, "This sale allows one purchase per customer, cancelled or not."];
}
