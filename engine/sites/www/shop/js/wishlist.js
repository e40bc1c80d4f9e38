// Wishlist: saved products with "Move to cart" and "Remove" buttons.
(function () {
  "use strict";
  Shop.renderChrome("");
  const area = document.getElementById("wishlist-area");
  const esc = Shop.escapeHtml;
  function render(note) {
    Shop.refreshCounts();
    const ids = Shop.wishlist();
    const noteHtml = note ? '<div class="notice ok" id="wishlist-message">' + note + "</div>" : "";
    if (!ids.length) {
      area.innerHTML = noteHtml + '<div class="empty">Your wishlist is empty. Tap ♡ on any product to save it here.</div>';
      return;
    }
    area.innerHTML = noteHtml + '<table class="cart" id="wishlist-table"><thead><tr><th>Product</th><th class="num">Price</th>' +
      "<th>Availability</th><th></th></tr></thead><tbody>" + ids.map((id) => {
        const p = Shop.product(id);
        return '<tr data-id="' + p.id + '"><td><a href="product.html?id=' + p.id + '">' + esc(p.name) + '</a></td><td class="num">' +
          Shop.money(p.price) + "</td><td>" + Shop.stockLabel(p) + "</td><td>" +
          (p.stock > 0 ? '<button class="btn small move" type="button">Move to cart</button> ' : "") +
          '<button class="btn small secondary remove" type="button">Remove</button></td></tr>';
      }).join("") + "</tbody></table>";
  }
  area.addEventListener("click", (ev) => {
    const row = ev.target.closest("tr[data-id]");
    if (!row) return;
    const p = Shop.product(row.dataset.id);
    if (ev.target.classList.contains("move")) {
      const inCart = (Shop.cart().find((l) => l.id === p.id) || { qty: 0 }).qty;
      if (inCart < p.stock) Shop.addToCart(p.id, 1);
      Shop.toggleWishlist(p.id);
      render("Moved " + esc(p.name) + " to your cart.");
    } else if (ev.target.classList.contains("remove")) {
      Shop.toggleWishlist(p.id);
      render("Removed " + esc(p.name) + " from your wishlist.");
    }
  });
  render("");
})();
