// Past orders placed in this browser.
(function () {
  "use strict";
  Shop.renderChrome("");
  const list = Shop.orders();
  document.getElementById("orders-area").innerHTML = list.length
    ? '<table class="cart"><thead><tr><th>Order</th><th>Items</th><th class="num">Total</th></tr></thead><tbody>' +
      list.map((o) => '<tr><td><a href="confirmation.html?order=' + o.number + '">' + o.number + "</a></td><td>" +
        o.items.reduce((n, i) => n + i.qty, 0) + '</td><td class="num">' + Shop.money(o.total) + "</td></tr>").join("") +
      "</tbody></table>"
    : '<div class="empty">You have not placed any orders yet.</div>';
})();
