// All categories with the number of pages in each.
(function () {
  "use strict";
  Wiki.renderChrome();
  document.getElementById("category-index").innerHTML = Wiki.allCategories().map(([name, n]) =>
    '<li><a href="' + Wiki.categoryUrl(name) + '">' + Wiki.escapeHtml(name) + "</a> (" + n + " page" + (n === 1 ? "" : "s") +
    ")</li>").join("");
})();
