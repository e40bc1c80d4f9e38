// Home page: category tiles and two product rows computed from the catalogue.
(function () {
  "use strict";
  Shop.renderChrome("");
  const products = window.SHOP_PRODUCTS;

  document.getElementById("category-grid").innerHTML = window.SHOP_CATEGORIES.map((c) => {
    const n = products.filter((p) => p.category === c.id).length;
    return '<a class="category-tile" href="category.html?c=' + c.id + '"><img src="img/cat-' + c.id +
      '.svg" alt="" width="64" height="60"><strong>' + c.name + "</strong><span>" + n + " products</span></a>";
  }).join("");

  // Highest rating first; the review count breaks ties so the order never depends on the engine.
  const top = products.slice().sort(Shop.SORTS.rating.cmp).slice(0, 8);
  document.getElementById("top-rated").innerHTML = top.map(Shop.card).join("");

  const cheap = products.filter((p) => p.price < 25).sort(Shop.SORTS["price-asc"].cmp);
  document.getElementById("under-25").innerHTML = cheap.map(Shop.card).join("");
})();
