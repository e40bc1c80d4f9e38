// Category page: category.html?name=<Category_name>, listing its articles alphabetically.
(function () {
  "use strict";
  Wiki.renderChrome();
  const content = document.getElementById("content");
  const name = Wiki.fromSlug(Wiki.param("name"));
  const esc = Wiki.escapeHtml;
  const members = Wiki.articles.filter((a) => a.categories.some((c) => c.toLowerCase() === name.toLowerCase()))
    .sort((x, y) => x.title.localeCompare(y.title));
  if (!members.length) {
    document.title = "Category not found – Lexica";
    content.innerHTML = '<h1 class="page-title">Category: ' + esc(name) + '</h1><p>This category does not exist. See ' +
      '<a href="categories.html">all categories</a>.</p>';
    return;
  }
  const real = members[0].categories.find((c) => c.toLowerCase() === name.toLowerCase());
  document.title = "Category:" + real + " – Lexica";
  const note = window.WIKI_CATEGORY_NOTES[real] || "";
  content.innerHTML = '<h1 class="page-title">Category: ' + esc(real) + "</h1>" +
    '<div class="tagline">From Lexica, the free encyclopedia</div>' + (note ? "<p>" + esc(note) + "</p>" : "") +
    '<h2>Pages in category "' + esc(real) + '"</h2><p id="member-count">This category contains the following ' +
    members.length + (members.length === 1 ? " page" : " pages") + '.</p><ul class="category-list" id="members">' +
    members.map((a) => '<li><a href="' + Wiki.articleUrl(a.title) + '">' + esc(a.title) + "</a></li>").join("") + "</ul>";
})();
