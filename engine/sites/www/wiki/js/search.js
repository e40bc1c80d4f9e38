// Search: search.html?q=<text>. Like most wikis, an exact title match goes straight to the article
// unless fulltext=1 is given; otherwise every article containing all the words is listed, title
// matches first, with a snippet around the first match.
(function () {
  "use strict";
  Wiki.renderChrome();
  const content = document.getElementById("content");
  const q = (Wiki.param("q") || "").trim();
  const esc = Wiki.escapeHtml;
  if (q && Wiki.param("fulltext") !== "1") {
    const exact = Wiki.find(q);
    if (exact) {
      location.replace(Wiki.articleUrl(exact.title));
      return;
    }
  }
  document.title = (q ? q + " – " : "") + "Search results – Lexica";
  const words = q.toLowerCase().split(/\s+/).filter(Boolean);
  const results = [];
  for (const a of Wiki.articles) {
    const text = Wiki.fullText(a);
    const hay = (a.title + "\n" + text).toLowerCase();
    if (!words.length || !words.every((w) => hay.includes(w))) continue;
    const inTitle = words.filter((w) => a.title.toLowerCase().includes(w)).length;
    results.push({ a, text, score: inTitle * 10 + words.reduce((n, w) => n + hay.split(w).length - 1, 0) });
  }
  results.sort((x, y) => y.score - x.score || x.a.title.localeCompare(y.a.title));

  function snippet(text) {
    const lower = text.toLowerCase();
    const at = words.length ? lower.indexOf(words[0]) : 0;
    const start = Math.max(0, at - 60);
    let s = (start > 0 ? "… " : "") + text.slice(start, start + 200).replace(/\s+/g, " ") + " …";
    s = esc(s);
    for (const w of words) s = s.replace(new RegExp("(" + w.replace(/[.*+?^${}()|[\]\\]/g, "\\$&") + ")", "gi"), "<b>$1</b>");
    return s;
  }

  content.innerHTML = '<h1 class="page-title">Search results</h1>' +
    '<form class="big-search" action="search.html" method="get"><input id="search-page-input" type="search" name="q" value="' +
    esc(q) + '" aria-label="Search text"><input type="hidden" name="fulltext" value="1">' +
    '<button id="search-page-button" type="submit">Search</button></form>' +
    (q ? '<p class="result-count" id="result-count">' + (results.length
      ? "Showing " + results.length + " result" + (results.length === 1 ? "" : "s") + " for <b>" + esc(q) + "</b>."
      : "There were no results matching the query <b>" + esc(q) + "</b>.") + "</p>" : "<p>Enter a word to search for.</p>") +
    '<ul class="search-results" id="search-results">' + results.map((r) =>
      '<li><a class="result-title" href="' + Wiki.articleUrl(r.a.title) + '">' + esc(r.a.title) + "</a>" +
      '<div class="snippet">' + snippet(r.text) + '</div><div class="result-meta">' + r.a.categories[0] + "</div></li>").join("") +
    "</ul>";
})();
