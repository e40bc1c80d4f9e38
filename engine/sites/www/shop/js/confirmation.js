// Order confirmation: confirmation.html?order=<number>, read back from localStorage.
(function () {
  "use strict";
  Shop.renderChrome("");
  const area = document.getElementById("confirmation-area");
  const esc = Shop.escapeHtml;
  const number = Shop.param("order");
  const order = Shop.orders().find((o) => o.number === number);
  if (!order) {
    area.innerHTML = '<h1>Order not found</h1><p>We could not find that order. <a href="orders.html">See your orders</a></p>';
    return;
  }
  const method = window.SHOP_SHIPPING.find((m) => m.id === order.shipping);
  const first = order.name.split(/\s+/)[0];
  area.innerHTML =
    "<h1>Thank you, " + esc(first) + "! Your order has been placed.</h1>" +
    '<div class="layout-2col"><div class="order-box"><p>Order number</p><div class="order-number" id="order-number">' + order.number +
    "</div><p>A confirmation email is on its way to <strong>" + esc(order.email) + "</strong>.</p>" +
    "<h3>Shipping to</h3><p id=\"ship-to\">" + esc(order.name) + "<br>" + esc(order.address) + "<br>" + esc(order.city) + " " +
    esc(order.zip) + "</p><h3>Delivery</h3><p id=\"delivery\">" + method.label + (order.giftWrap ? " · gift wrapped" : "") + "</p>" +
    '</div><aside class="summary"><h2>Order summary</h2>' +
    order.items.map((i) => '<div class="row"><span>' + i.qty + " × " + esc(i.name) + "</span><span>" + Shop.money(i.price * i.qty) + "</span></div>").join("") +
    '<div class="row"><span>Subtotal</span><span>' + Shop.money(order.subtotal) + "</span></div>" +
    (order.discount ? '<div class="row"><span>Discount (' + esc(order.promo) + ")</span><span>−" + Shop.money(order.discount) + "</span></div>" : "") +
    '<div class="row"><span>Shipping</span><span>' + (order.shippingCost ? Shop.money(order.shippingCost) : "Free") + "</span></div>" +
    (order.wrap ? '<div class="row"><span>Gift wrap</span><span>' + Shop.money(order.wrap) + "</span></div>" : "") +
    '<div class="row total"><span>Total</span><span id="order-total">' + Shop.money(order.total) + "</span></div></aside></div>" +
    '<p><a class="btn secondary" href="index.html">Continue shopping</a></p>';
  document.title = "Order " + order.number + " confirmed – Maple Market";
})();
