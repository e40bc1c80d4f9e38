// Checkout: shipping details with validation messages next to each field, a shipping-method select,
// optional gift wrap and a live order summary. A valid order is stored and the confirmation page
// opens with its order number.
(function () {
  "use strict";
  Shop.renderChrome("");
  const area = document.getElementById("checkout-area");
  const esc = Shop.escapeHtml;
  const lines = Shop.cart();
  if (!lines.length) {
    area.innerHTML = '<div class="empty" id="empty-cart">Your cart is empty, so there is nothing to check out. ' +
      '<a href="index.html">Continue shopping</a></div>';
    return;
  }

  function field(id, label, type, extra) {
    return '<div class="field' + (extra || "") + '" id="field-' + id + '"><label for="' + id + '">' + label + "</label>" +
      '<input id="' + id + '" name="' + id + '" type="' + type + '"><div class="error-text" id="' + id + '-error"></div></div>';
  }
  const shippingOptions = window.SHOP_SHIPPING.map((m) => '<option value="' + m.id + '">' + m.label + "</option>").join("");
  area.innerHTML =
    '<div class="layout-2col"><form id="checkout-form" novalidate>' +
    '<div id="form-errors"></div>' +
    "<h2>Shipping address</h2><div class=\"form-grid\">" +
    field("name", "Full name", "text", " wide") + field("email", "Email address", "email", " wide") +
    field("address", "Street address", "text", " wide") + field("city", "City", "text") + field("zip", "ZIP code", "text") +
    "</div><h2>Delivery</h2><div class=\"form-grid\">" +
    '<div class="field wide" id="field-shipping"><label for="shipping">Shipping method</label>' +
    '<select id="shipping" name="shipping"><option value="">Choose a shipping method</option>' + shippingOptions + "</select>" +
    '<div class="error-text" id="shipping-error"></div></div>' +
    '<label class="check wide"><input type="checkbox" id="giftwrap" name="giftwrap"> Add gift wrapping (+$4.99)</label>' +
    '</div><p><button class="btn" id="place-order" type="submit">Place order</button></p></form>' +
    '<aside class="summary" id="order-summary"></aside></div>';

  const form = document.getElementById("checkout-form");
  function summary() {
    const t = Shop.totals(lines, form.shipping.value, form.giftwrap.checked);
    const items = lines.map((l) => {
      const p = Shop.product(l.id);
      return '<div class="row"><span>' + l.qty + " × " + esc(p.name) + "</span><span>" + Shop.money(p.price * l.qty) + "</span></div>";
    }).join("");
    document.getElementById("order-summary").innerHTML = "<h2>Your order</h2>" + items +
      '<div class="row"><span>Subtotal</span><span id="subtotal">' + Shop.money(t.subtotal) + "</span></div>" +
      (t.discount ? '<div class="row"><span>Discount (' + esc(t.code) + ')</span><span id="discount">−' + Shop.money(t.discount) + "</span></div>" : "") +
      '<div class="row"><span>Shipping</span><span id="shipping-cost">' + (t.method ? (t.shipping ? Shop.money(t.shipping) : "Free") : "Choose a method") +
      "</span></div>" + (t.wrap ? '<div class="row"><span>Gift wrap</span><span>' + Shop.money(t.wrap) + "</span></div>" : "") +
      '<div class="row total"><span>Total</span><span id="total">' + Shop.money(t.total) + "</span></div>";
    return t;
  }
  form.shipping.addEventListener("change", summary);
  form.giftwrap.addEventListener("change", summary);
  summary();

  const RULES = [
    ["name", (v) => v.length >= 2, "Please enter your full name."],
    ["email", (v) => /^[^\s@]+@[^\s@]+\.[^\s@]+$/.test(v), "Please enter a valid email address."],
    ["address", (v) => v.length >= 4, "Please enter your street address."],
    ["city", (v) => v.length >= 2, "Please enter your city."],
    ["zip", (v) => /^\d{5}$/.test(v), "ZIP code must be 5 digits."],
    ["shipping", (v) => v !== "", "Please choose a shipping method."],
  ];
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    let bad = 0;
    for (const [id, ok, text] of RULES) {
      const value = form[id].value.trim();
      const valid = ok(value);
      document.getElementById("field-" + id).classList.toggle("invalid", !valid);
      document.getElementById(id + "-error").textContent = valid ? "" : text;
      if (!valid) bad++;
    }
    const errors = document.getElementById("form-errors");
    if (bad) {
      errors.innerHTML = '<div class="notice error" role="alert">Please correct the ' + bad + " highlighted field" +
        (bad > 1 ? "s" : "") + ".</div>";
      return;
    }
    const t = summary();
    const order = {
      name: form.name.value.trim(), email: form.email.value.trim(), address: form.address.value.trim(),
      city: form.city.value.trim(), zip: form.zip.value.trim(), shipping: form.shipping.value,
      giftWrap: form.giftwrap.checked, promo: t.code,
      items: lines.map((l) => ({ id: l.id, name: Shop.product(l.id).name, qty: l.qty, price: Shop.product(l.id).price })),
      subtotal: t.subtotal, discount: t.discount, shippingCost: t.shipping, wrap: t.wrap, total: t.total,
    };
    const number = Shop.placeOrder(order);
    location.href = "confirmation.html?order=" + encodeURIComponent(number);
  });
})();
