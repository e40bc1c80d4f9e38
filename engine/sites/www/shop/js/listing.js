// Shared by the category and search pages: fills the sort/colour/in-stock toolbar from the URL,
// submits the toolbar form whenever a control changes (so every view has its own URL), and renders
// the filtered, sorted product grid.
window.ShopListing = (function () {
  "use strict";

  function setupToolbar(colours) {
    const sort = Shop.param("sort") || "featured";
    const sortSelect = document.getElementById("sort");
    sortSelect.innerHTML = Object.entries(Shop.SORTS).map(([key, s]) =>
      '<option value="' + key + '"' + (key === sort ? " selected" : "") + ">" + s.label + "</option>").join("");

    const colourSelect = document.getElementById("colour");
    if (colourSelect) {
      const current = Shop.param("colour") || "";
      colourSelect.innerHTML = '<option value="">All colours</option>' + colours.map((c) =>
        '<option value="' + c + '"' + (c === current ? " selected" : "") + ">" + c + "</option>").join("");
    }
    const instock = document.getElementById("instock");
    instock.checked = Shop.param("instock") === "1";

    const form = document.getElementById("filters");
    form.querySelectorAll("select, input[type=checkbox]").forEach((el) =>
      el.addEventListener("change", () => form.submit()));
  }

  function render(products) {
    const sort = Shop.SORTS[Shop.param("sort")] || Shop.SORTS.featured;
    const colour = Shop.param("colour");
    let list = products.slice();
    if (colour) list = list.filter((p) => p.colour === colour);
    if (Shop.param("instock") === "1") list = list.filter((p) => p.stock > 0);
    list.sort(sort.cmp);
    document.getElementById("result-count").textContent = list.length + (list.length === 1 ? " product" : " products");
    document.getElementById("results").innerHTML = list.length
      ? list.map(Shop.card).join("")
      : '<div class="empty">No products match these filters.</div>';
  }

  return { setupToolbar, render };
})();
