// Alphabetical index of every article, grouped by first letter.
(function () {
  "use strict";
  Wiki.renderChrome();
  const sorted = Wiki.articles.slice().sort((x, y) => x.title.localeCompare(y.title));
  const groups = new Map();
  for (const a of sorted) {
    const letter = a.title[0].toUpperCase();
    if (!groups.has(letter)) groups.set(letter, []);
    groups.get(letter).push(a);
  }
  document.getElementById("index").innerHTML = [...groups.entries()].map(([letter, list]) =>
    '<div class="letter-group"><h3>' + letter + "</h3><ul>" + list.map((a) =>
      '<li><a href="' + Wiki.articleUrl(a.title) + '">' + Wiki.escapeHtml(a.title) + "</a></li>").join("") + "</ul></div>").join("");
})();
