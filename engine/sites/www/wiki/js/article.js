// Article page: article.html?title=<Title_with_underscores>. Renders the infobox, the table of
// contents, the sections, "See also" and the category links.
(function () {
  "use strict";
  Wiki.renderChrome();
  const content = document.getElementById("content");
  const a = Wiki.find(Wiki.param("title"));
  if (!a) {
    const wanted = Wiki.fromSlug(Wiki.param("title"));
    document.title = "Page not found – Lexica";
    content.innerHTML = '<h1 class="page-title">' + Wiki.escapeHtml(wanted || "Page not found") + "</h1>" +
      "<p>Lexica does not have an article with this exact name. You can <a href=\"search.html?fulltext=1&amp;q=" +
      encodeURIComponent(wanted) + '">search for it</a> instead.</p>';
    return;
  }
  document.title = a.title + " – Lexica";
  const esc = Wiki.escapeHtml;
  const anchor = (h) => h.replace(/ /g, "_");

  const toc = a.sections.length >= 2
    ? '<nav class="toc" id="toc"><h2>Contents</h2><ol>' + a.sections.map((s) =>
      '<li><a href="#' + anchor(s[0]) + '">' + esc(s[0]) + "</a></li>").join("") +
      (a.seeAlso.length ? '<li><a href="#See_also">See also</a></li>' : "") + "</ol></nav>"
    : "";
  const infobox = '<table class="infobox" id="infobox"><caption>' + esc(a.title) + "</caption>" +
    '<tr><td colspan="2" class="infobox-image"><img src="img/' + a.kind + '.svg" alt="" width="220" height="150">' +
    '<div class="infobox-caption">' + esc(a.caption) + "</div></td></tr>" +
    a.infobox.map((r) => "<tr><th>" + esc(r[0]) + "</th><td>" + esc(r[1]) + "</td></tr>").join("") + "</table>";

  content.innerHTML =
    '<h1 class="page-title" id="firstHeading">' + esc(a.title) + "</h1>" +
    '<div class="tagline">From Lexica, the free encyclopedia</div>' +
    '<div class="article-body">' + infobox + Wiki.paragraphs(a.lead) + toc +
    a.sections.map((s) => '<h2 id="' + anchor(s[0]) + '">' + esc(s[0]) + "</h2>" + Wiki.paragraphs(s[1])).join("") +
    (a.seeAlso.length ? '<h2 id="See_also">See also</h2><ul class="see-also">' +
      a.seeAlso.map((t) => "<li>" + Wiki.inline("[[" + t + "]]") + "</li>").join("") + "</ul>" : "") +
    "</div>" +
    '<div class="catlinks" id="catlinks">Categories: ' +
    a.categories.map((c) => '<a href="' + Wiki.categoryUrl(c) + '">' + esc(c) + "</a>").join(" | ") + "</div>" +
    '<div class="lastmod">This page was last edited on ' + a.edited + ".</div>";
})();
