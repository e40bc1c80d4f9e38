// Cart page: change quantities (each row is its own small form, so Enter in a quantity box applies
// it), remove lines, apply or remove a promo code, then go to checkout.
(function () {
  "use strict";
  Shop.renderChrome("");
  const area = document.getElementById("cart-area");
  const esc = Shop.escapeHtml;
  let message = null; // {kind, text} shown once after the next render

  function render() {
    const lines = Shop.cart();
    Shop.refreshCounts();
    const note = message ? '<div class="notice ' + message.kind + '" id="cart-message">' + message.text + "</div>" : "";
    message = null;
    if (!lines.length) {
      area.innerHTML = note + '<div class="empty" id="empty-cart">Your cart is empty. <a href="index.html">Continue shopping</a></div>';
      return;
    }
    const t = Shop.totals(lines, "standard", false);
    const rows = lines.map((l) => {
      const p = Shop.product(l.id);
      return '<tr data-id="' + p.id + '"><td><a href="product.html?id=' + p.id + '">' + esc(p.name) + "</a></td>" +
        '<td class="num">' + Shop.money(p.price) + "</td>" +
        '<td><form class="qty-form"><input class="qty" type="number" min="0" max="' + p.stock + '" value="' + l.qty +
        '" aria-label="Quantity for ' + esc(p.name) + '"><button class="btn small secondary update" type="submit">Update</button></form></td>' +
        '<td class="num line-total">' + Shop.money(p.price * l.qty) + "</td>" +
        '<td><button class="btn small secondary remove" type="button">Remove</button></td></tr>';
    }).join("");
    const promo = Shop.promoCode();
    const promoHtml = promo
      ? '<p id="promo-applied">Code <strong>' + esc(promo) + "</strong> applied: " + window.SHOP_PROMOS[promo].label +
        '. <button class="btn small secondary" id="remove-promo" type="button">Remove code</button></p>' +
        (t.promoNote ? '<p class="notice error">' + esc(t.promoNote) + "</p>" : "")
      : '<form class="promo-form" id="promo-form"><input id="promo-input" placeholder="Promo code" aria-label="Promo code">' +
        '<button class="btn small" id="apply-promo" type="submit">Apply</button></form>';
    area.innerHTML = note + '<div class="layout-2col"><table class="cart" id="cart-table"><thead><tr><th>Product</th>' +
      '<th class="num">Price</th><th>Quantity</th><th class="num">Total</th><th></th></tr></thead><tbody>' + rows +
      '</tbody></table><aside class="summary"><h2>Order summary</h2>' +
      '<div class="row"><span>Subtotal (' + Shop.cartCount() + ' items)</span><span id="subtotal">' + Shop.money(t.subtotal) + "</span></div>" +
      (t.discount ? '<div class="row"><span>Discount (' + esc(t.code) + ')</span><span id="discount">−' + Shop.money(t.discount) + "</span></div>" : "") +
      '<div class="row"><span>Standard shipping</span><span id="shipping">' + (t.shipping ? Shop.money(t.shipping) : "Free") + "</span></div>" +
      '<div class="row total"><span>Estimated total</span><span id="total">' + Shop.money(t.total) + "</span></div>" +
      promoHtml + '<a class="btn" id="checkout-button" href="checkout.html">Proceed to checkout</a></aside></div>';
  }

  // Event delegation: the table is re-rendered after every change.
  area.addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (ev.target.id === "promo-form") {
      const code = document.getElementById("promo-input").value.trim().toUpperCase();
      if (window.SHOP_PROMOS[code]) {
        Shop.setPromoCode(code);
        message = { kind: "ok", text: "Promo code " + code + " applied." };
      } else {
        message = { kind: "error", text: code ? 'Sorry, "' + esc(code) + '" is not a valid promo code.' : "Please enter a promo code." };
      }
      render();
      return;
    }
    const row = ev.target.closest("tr[data-id]");
    if (!row) return;
    const p = Shop.product(row.dataset.id);
    const raw = row.querySelector(".qty").value.trim();
    const qty = Number(raw);
    if (!/^\d+$/.test(raw)) {
      message = { kind: "error", text: "Please enter a whole number for " + esc(p.name) + "." };
    } else if (qty > p.stock) {
      message = { kind: "error", text: "Only " + p.stock + " of " + esc(p.name) + " are in stock." };
    } else {
      Shop.setCart(Shop.cart().map((l) => (l.id === p.id ? { id: l.id, qty: qty } : l)));
      message = { kind: "ok", text: qty ? "Updated " + esc(p.name) + " to " + qty + "." : "Removed " + esc(p.name) + " from your cart." };
    }
    render();
  });
  area.addEventListener("click", (ev) => {
    if (ev.target.id === "remove-promo") {
      Shop.setPromoCode(null);
      message = { kind: "ok", text: "Promo code removed." };
      render();
    } else if (ev.target.classList.contains("remove")) {
      const id = ev.target.closest("tr[data-id]").dataset.id;
      Shop.setCart(Shop.cart().filter((l) => l.id !== id));
      message = { kind: "ok", text: "Removed " + esc(Shop.product(id).name) + " from your cart." };
      render();
    }
  });
  render();
})();
