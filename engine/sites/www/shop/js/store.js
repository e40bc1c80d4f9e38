// Shared helpers for every Maple Market page: catalogue lookups, the cart/wishlist/orders kept in
// localStorage (each episode gets a fresh browser context, so nothing is shared between agents),
// money formatting, product artwork and the common header and footer.
(function () {
  "use strict";

  const KEYS = { cart: "shop.cart", wishlist: "shop.wishlist", promo: "shop.promo", orders: "shop.orders" };
  const byId = new Map(window.SHOP_PRODUCTS.map((p) => [p.id, p]));

  function load(key, fallback) {
    try {
      const raw = localStorage.getItem(key);
      return raw === null ? fallback : JSON.parse(raw);
    } catch (e) {
      return fallback;
    }
  }
  function save(key, value) {
    localStorage.setItem(key, JSON.stringify(value));
  }

  function escapeHtml(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }
  function money(n) {
    return "$" + n.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
  }
  function param(name) {
    return new URLSearchParams(location.search).get(name);
  }
  function product(id) {
    return byId.get(id) || null;
  }
  function category(id) {
    return window.SHOP_CATEGORIES.find((c) => c.id === id) || null;
  }

  // -- cart -------------------------------------------------------------------------------------
  function cart() {
    // Drop lines whose product no longer exists, so a stale cart never breaks a page.
    return load(KEYS.cart, []).filter((line) => byId.has(line.id) && line.qty > 0);
  }
  function setCart(lines) {
    save(KEYS.cart, lines.filter((line) => line.qty > 0));
  }
  function addToCart(id, qty) {
    const lines = cart();
    const line = lines.find((l) => l.id === id);
    if (line) line.qty += qty;
    else lines.push({ id: id, qty: qty });
    setCart(lines);
  }
  function cartCount() {
    return cart().reduce((n, line) => n + line.qty, 0);
  }

  // -- wishlist ---------------------------------------------------------------------------------
  function wishlist() {
    return load(KEYS.wishlist, []).filter((id) => byId.has(id));
  }
  function toggleWishlist(id) {
    const ids = wishlist();
    const i = ids.indexOf(id);
    if (i >= 0) ids.splice(i, 1);
    else ids.push(id);
    save(KEYS.wishlist, ids);
    return i < 0;
  }

  // -- totals -----------------------------------------------------------------------------------
  function promoCode() {
    return load(KEYS.promo, null);
  }
  function setPromoCode(code) {
    if (code) save(KEYS.promo, code);
    else localStorage.removeItem(KEYS.promo);
  }

  // One place computes every total, so the cart, checkout and confirmation pages always agree.
  function totals(lines, shippingId, giftWrap) {
    const subtotal = round2(lines.reduce((s, l) => s + product(l.id).price * l.qty, 0));
    const code = promoCode();
    const promo = code ? window.SHOP_PROMOS[code] : null;
    let discount = 0;
    let promoNote = "";
    if (promo && subtotal >= promo.minSubtotal) {
      if (promo.percent) discount = round2((subtotal * promo.percent) / 100);
      if (promo.amount) discount = Math.min(promo.amount, subtotal);
    } else if (promo) {
      promoNote = code + " needs a subtotal of " + money(promo.minSubtotal) + " or more.";
    }
    const method = window.SHOP_SHIPPING.find((m) => m.id === shippingId) || null;
    let shipping = method ? method.price : 0;
    const freeStandard = (promo && promo.freeShipping) || subtotal - discount >= window.SHOP_FREE_SHIPPING_OVER;
    if (method && method.id === "standard" && freeStandard) shipping = 0;
    const wrap = giftWrap ? 4.99 : 0;
    const total = round2(subtotal - discount + shipping + wrap);
    return { subtotal, discount, shipping, wrap, total, code: promo ? code : null, promoNote, method };
  }
  function round2(n) {
    return Math.round(n * 100) / 100;
  }

  // -- orders -----------------------------------------------------------------------------------
  function orders() {
    return load(KEYS.orders, []);
  }
  // FNV-1a: a tiny deterministic hash, so the same order always gets the same order number.
  function hash(text) {
    let h = 0x811c9dc5;
    for (let i = 0; i < text.length; i++) {
      h ^= text.charCodeAt(i);
      h = Math.imul(h, 0x01000193) >>> 0;
    }
    return h >>> 0;
  }
  function orderNumber(order) {
    const key = [order.name, order.email, order.zip, order.shipping,
      order.items.map((i) => i.id + "x" + i.qty).join(",")].join("|").toLowerCase();
    return "MM-" + String(hash(key) % 1000000).padStart(6, "0");
  }
  function placeOrder(order) {
    order.number = orderNumber(order);
    const all = orders().filter((o) => o.number !== order.number);
    all.push(order);
    save(KEYS.orders, all);
    setCart([]);
    setPromoCode(null);
    return order.number;
  }

  // -- artwork ----------------------------------------------------------------------------------
  const COLOURS = {
    Black: "#2d2d30", Blue: "#2f6fd6", Silver: "#b9bec6", Green: "#3f9b5a", White: "#f3f3f0",
    Grey: "#858b94", Orange: "#e5862d", Brown: "#8b5a2b", Red: "#d23b3b", Yellow: "#f2c230",
    Pink: "#ef9ab6", Purple: "#7b4fb8",
  };
  // The product's drawing (js/art.js) painted in its colour, as inline SVG.
  function art(p, size) {
    const fill = COLOURS[p.colour] || "#999";
    return '<svg class="art" role="img" aria-label="' + escapeHtml(p.name) + '" width="' + size + '" height="' + size +
      '" viewBox="0 0 120 110"><rect width="120" height="110" fill="#f6f3ee"/>' + (window.SHOP_ICONS[p.icon] || "").replace(/"C"/g, '"' + fill + '"') +
      "</svg>";
  }
  function stars(rating) {
    const full = Math.round(rating);
    return '<span class="stars" aria-label="' + rating.toFixed(1) + ' out of 5 stars">' + "★".repeat(full) + "☆".repeat(5 - full) + "</span>";
  }
  function stockLabel(p) {
    if (p.stock === 0) return '<span class="stock out">Out of stock</span>';
    if (p.stock <= 5) return '<span class="stock low">Only ' + p.stock + " left in stock</span>";
    return '<span class="stock in">In stock</span>';
  }
  function card(p) {
    const url = "product.html?id=" + encodeURIComponent(p.id);
    return '<article class="product-card" data-id="' + p.id + '">' +
      '<a class="thumb" href="' + url + '" tabindex="-1">' + art(p, 150) + "</a>" +
      '<a class="product-link" href="' + url + '">' + escapeHtml(p.name) + "</a>" +
      '<div class="meta">' + stars(p.rating) + ' <span class="reviews">' + p.rating.toFixed(1) + " (" + p.reviews + ")</span></div>" +
      '<div class="price">' + money(p.price) + "</div>" + stockLabel(p) + "</article>";
  }

  // -- page chrome ------------------------------------------------------------------------------
  function renderChrome(active) {
    const header = document.getElementById("site-header");
    const q = param("q") || "";
    header.innerHTML =
      '<div class="topbar"><div class="wrap">Free standard shipping on orders over $75 · 30-day returns</div></div>' +
      '<div class="wrap header-main">' +
      '<a class="logo" href="index.html"><img src="img/logo.svg" alt="" width="36" height="36"> Maple Market</a>' +
      '<form class="search" action="search.html" method="get" role="search">' +
      '<input id="search-input" type="search" name="q" placeholder="Search products" aria-label="Search products" value="' + escapeHtml(q) + '">' +
      '<button id="search-button" type="submit">Search</button></form>' +
      '<nav class="account"><a id="orders-link" href="orders.html">Orders</a><a id="wishlist-link" href="wishlist.html">♡ Wishlist (' + wishlist().length + ")</a>" +
      '<a id="cart-link" href="cart.html">Cart (<span id="cart-count">' + cartCount() + "</span>)</a></nav></div>" +
      '<nav class="categories"><div class="wrap">' +
      window.SHOP_CATEGORIES.map((c) =>
        '<a href="category.html?c=' + c.id + '"' + (active === c.id ? ' class="active"' : "") + ">" + c.name + "</a>").join("") +
      '<a href="help.html"' + (active === "help" ? ' class="active"' : "") + ">Help</a></div></nav>";
    document.getElementById("site-footer").innerHTML =
      '<div class="wrap footer-cols"><div><h4>Maple Market</h4><p>Independent goods for home, kitchen and outdoors since 2011. ' +
      "12 Harbour Street, Portland, ME 04101.</p></div>" +
      '<div><h4>Customer service</h4><a href="help.html#shipping">Shipping</a><a href="help.html#returns">Returns</a>' +
      '<a href="help.html#contact">Contact us</a></div>' +
      "<div><h4>New here?</h4><p>Use code <strong>WELCOME5</strong> for $5 off your first order.</p></div></div>" +
      '<div class="wrap copyright">© 2026 Maple Market. All prices in US dollars.</div>';
  }
  function refreshCounts() {
    const count = document.getElementById("cart-count");
    if (count) count.textContent = String(cartCount());
    const wish = document.getElementById("wishlist-link");
    if (wish) wish.textContent = "♡ Wishlist (" + wishlist().length + ")";
  }

  // Sorting shared by category and search pages; the key comes from the ?sort= parameter. Labels start
  // with distinct words so that typing the first word into the open <select> picks the option.
  const SORTS = {
    featured: { label: "Featured", cmp: (a, b) => b.reviews - a.reviews },
    "price-asc": { label: "Lowest price first", cmp: (a, b) => a.price - b.price },
    "price-desc": { label: "Highest price first", cmp: (a, b) => b.price - a.price },
    rating: { label: "Top rated", cmp: (a, b) => b.rating - a.rating || b.reviews - a.reviews },
    name: { label: "Name (A-Z)", cmp: (a, b) => a.name.localeCompare(b.name) },
  };

  window.Shop = {
    load, save, escapeHtml, money, param, product, category, cart, setCart, addToCart, cartCount, wishlist,
    toggleWishlist, promoCode, setPromoCode, totals, orders, placeOrder, orderNumber, art, stars, stockLabel, card,
    renderChrome, refreshCounts, SORTS, COLOURS,
  };
})();
