// Search page: search.html?q=<words>&sort=<key>&instock=1. Every word must appear somewhere in the
// product's name, brand, category, colour or description (case-insensitive).
(function () {
  "use strict";
  Shop.renderChrome("");
  const q = (Shop.param("q") || "").trim();
  document.getElementById("filter-q").value = q;
  const words = q.toLowerCase().split(/\s+/).filter(Boolean);

  const matches = window.SHOP_PRODUCTS.filter((p) => {
    const cat = Shop.category(p.category);
    const text = [p.name, p.brand, cat.name, p.colour, p.description].join(" ").toLowerCase();
    return words.every((w) => text.includes(w));
  });
  document.getElementById("page-title").textContent = q ? 'Results for "' + q + '"' : "All products";
  document.title = (q ? q + " – Search" : "All products") + " – Maple Market";
  ShopListing.setupToolbar([]);
  ShopListing.render(matches);
})();
