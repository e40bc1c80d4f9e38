// Product page: product.html?id=<product id>. The quantity box and "Add to cart" button form one
// <form>, so pressing Enter in the quantity box adds to the cart just like clicking the button.
(function () {
  "use strict";
  Shop.renderChrome("");
  const main = document.getElementById("main");
  const p = Shop.product(Shop.param("id"));
  if (!p) {
    main.innerHTML = '<h1>Product not found</h1><p>This product does not exist. <a href="index.html">Back to the shop</a></p>';
    document.title = "Product not found – Maple Market";
    return;
  }
  const cat = Shop.category(p.category);
  document.title = p.name + " – Maple Market";
  const esc = Shop.escapeHtml;
  const soldOut = p.stock === 0;

  const related = window.SHOP_PRODUCTS.filter((o) => o.category === p.category && o.id !== p.id)
    .sort(Shop.SORTS.featured.cmp).slice(0, 4);

  main.innerHTML =
    '<div class="breadcrumb"><a href="index.html">Home</a> › <a href="category.html?c=' + cat.id + '">' + cat.name +
    "</a> › " + esc(p.name) + "</div>" +
    '<div class="product-page"><div class="gallery">' + Shop.art(p, 360) + "</div><div>" +
    '<div class="brand">' + esc(p.brand) + "</div><h1>" + esc(p.name) + "</h1>" +
    '<div class="meta">' + Shop.stars(p.rating) + ' <span class="reviews">' + p.rating.toFixed(1) + " out of 5 · " +
    p.reviews + " reviews</span></div>" +
    '<div class="price" id="price">' + Shop.money(p.price) + "</div>" + Shop.stockLabel(p) +
    '<p id="description">' + esc(p.description) + "</p>" +
    '<form class="buy-box" id="buy-form" novalidate>' +
    '<label for="qty"><strong>Quantity</strong></label>' +
    '<input id="qty" name="qty" type="number" min="1" max="' + Math.max(p.stock, 1) + '" value="1"' + (soldOut ? " disabled" : "") + ">" +
    '<button class="btn" id="add-to-cart" type="submit"' + (soldOut ? " disabled" : "") + ">" +
    (soldOut ? "Out of stock" : "Add to cart") + "</button>" +
    '<button class="btn secondary" id="wishlist-button" type="button"></button></form>' +
    '<div id="notice" role="status"></div>' +
    "<h3>Highlights</h3><ul>" + p.features.map((f) => "<li>" + esc(f) + "</li>").join("") + "</ul>" +
    '<table class="specs"><tr><th>Brand</th><td>' + esc(p.brand) + "</td></tr><tr><th>Colour</th><td>" + p.colour +
    "</td></tr><tr><th>Category</th><td>" + cat.name + "</td></tr><tr><th>Item number</th><td>" + p.id +
    "</td></tr></table></div></div>" +
    "<h2>More in " + cat.name + '</h2><div class="product-grid" id="related">' + related.map(Shop.card).join("") + "</div>";

  const notice = document.getElementById("notice");
  function show(kind, html) {
    notice.className = "notice " + kind;
    notice.innerHTML = html;
  }

  const wishButton = document.getElementById("wishlist-button");
  function paintWish() {
    wishButton.textContent = Shop.wishlist().includes(p.id) ? "♥ In your wishlist" : "♡ Add to wishlist";
  }
  paintWish();
  wishButton.addEventListener("click", () => {
    const added = Shop.toggleWishlist(p.id);
    paintWish();
    Shop.refreshCounts();
    show("ok", added ? "Saved to your wishlist." : "Removed from your wishlist.");
  });

  document.getElementById("buy-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (soldOut) return;
    const raw = document.getElementById("qty").value.trim();
    const qty = Number(raw);
    if (!/^\d+$/.test(raw) || qty < 1) {
      show("error", "Please enter a quantity of at least 1.");
      return;
    }
    const inCart = (Shop.cart().find((l) => l.id === p.id) || { qty: 0 }).qty;
    if (inCart + qty > p.stock) {
      const left = p.stock - inCart;
      show("error", left > 0 ? "Sorry, only " + left + " more can be added (" + p.stock + " in stock)."
        : "You already have all " + p.stock + " in your cart.");
      return;
    }
    Shop.addToCart(p.id, qty);
    Shop.refreshCounts();
    show("ok", "Added " + qty + " × " + esc(p.name) + ' to your cart. <a href="cart.html" id="view-cart">View cart</a>');
  });
})();
