// My orders: while one is pending, the page looks again.

/** The page is rendered by the server; while an order is pending, look again. */
export function ordersPage() {
  if (!document.querySelector("tr.is-pending")) {
    sessionStorage.removeItem("orders-reloads");
    return;
  }
  const tries = Number(sessionStorage.getItem("orders-reloads") || "0");
  if (tries >= 20) return;
  setTimeout(() => {
    if (document.hidden) return;
    sessionStorage.setItem("orders-reloads", String(tries + 1));
    location.reload();
  }, 3000);
}
