// Category page: category.html?c=<id>&sort=<key>&colour=<Colour>&instock=1
(function () {
  "use strict";
  const cat = Shop.category(Shop.param("c"));
  Shop.renderChrome(cat ? cat.id : "");
  if (!cat) {
    document.getElementById("page-title").textContent = "Category not found";
    document.getElementById("filters").hidden = true;
    return;
  }
  document.title = cat.name + " – Maple Market";
  document.getElementById("crumb").textContent = cat.name;
  document.getElementById("page-title").textContent = cat.name;
  document.getElementById("blurb").textContent = cat.blurb;
  document.getElementById("filter-category").value = cat.id;

  const products = window.SHOP_PRODUCTS.filter((p) => p.category === cat.id);
  const colours = [...new Set(products.map((p) => p.colour))].sort();
  ShopListing.setupToolbar(colours);
  ShopListing.render(products);
})();
