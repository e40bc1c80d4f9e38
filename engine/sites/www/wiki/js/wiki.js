// Shared Lexica helpers: article lookup by title or URL slug, the tiny wiki markup renderer, and the
// page chrome (logo, sidebar, search box) that every page shares.
(function () {
  "use strict";
  const articles = window.WIKI_ARTICLES;

  function slug(title) {
    return title.replace(/ /g, "_");
  }
  function fromSlug(s) {
    return String(s || "").replace(/_/g, " ").trim();
  }
  const byTitle = new Map(articles.map((a) => [a.title.toLowerCase(), a]));
  function find(title) {
    return byTitle.get(fromSlug(title).toLowerCase()) || null;
  }
  function articleUrl(title) {
    return "article.html?title=" + encodeURIComponent(slug(title));
  }
  function categoryUrl(name) {
    return "category.html?name=" + encodeURIComponent(slug(name));
  }
  function param(name) {
    return new URLSearchParams(location.search).get(name);
  }
  function escapeHtml(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }

  // [[Title]] / [[Title|label]] become links; a link to a missing article becomes red plain text
  // (no dead links, so nothing ever 404s). **x** is bold. Blank lines separate paragraphs.
  function inline(text) {
    return escapeHtml(text)
      .replace(/\[\[([^\]|]+)(?:\|([^\]]+))?\]\]/g, (m, target, label) => {
        const a = find(target);
        const shown = label || target;
        return a ? '<a href="' + articleUrl(a.title) + '" title="' + escapeHtml(a.title) + '">' + shown + "</a>"
          : '<span class="new" title="' + target + ' (page does not exist)">' + shown + "</span>";
      })
      .replace(/\*\*([^*]+)\*\*/g, "<b>$1</b>");
  }
  function paragraphs(text) {
    return text.split(/\n\s*\n/).map((p) => "<p>" + inline(p.trim()) + "</p>").join("");
  }
  // Plain text (links reduced to their labels), used for search.
  function plain(text) {
    return text.replace(/\[\[([^\]|]+)(?:\|([^\]]+))?\]\]/g, (m, t, l) => l || t).replace(/\*\*/g, "");
  }
  function fullText(a) {
    return plain([a.lead].concat(a.sections.map((s) => s[0] + "\n" + s[1])).join("\n\n"));
  }

  function allCategories() {
    const counts = new Map();
    articles.forEach((a) => a.categories.forEach((c) => counts.set(c, (counts.get(c) || 0) + 1)));
    return [...counts.entries()].sort((x, y) => x[0].localeCompare(y[0]));
  }

  function renderChrome() {
    const q = param("q") || "";
    document.getElementById("sidebar").innerHTML =
      '<a class="logo" href="index.html"><img src="img/logo.svg" alt="" width="96" height="96"><span>Lexica</span>' +
      "<small>The free encyclopedia</small></a>" +
      '<nav><h3>Navigation</h3><a href="index.html">Main page</a><a href="all.html">All articles</a>' +
      '<a href="categories.html">Categories</a><a href="about.html">About Lexica</a></nav>' +
      '<nav><h3>Portals</h3><a href="' + categoryUrl("Cities") + '">Cities</a><a href="' + categoryUrl("Scientists") +
      '">Scientists</a><a href="' + categoryUrl("Animals") + '">Animals</a><a href="' + categoryUrl("Inventions") +
      '">Inventions</a><a href="' + categoryUrl("Rivers") + '">Rivers</a></nav>';
    document.getElementById("topbar").innerHTML =
      '<form class="searchbox" action="search.html" method="get" role="search">' +
      '<input id="search-input" type="search" name="q" placeholder="Search Lexica" aria-label="Search Lexica" value="' +
      escapeHtml(q) + '"><button id="search-button" type="submit">Search</button></form>';
    // An exact title match opens the article directly (one navigation instead of a redirect through
    // the results page); anything else goes to the search results as usual.
    document.querySelector("#topbar form").addEventListener("submit", (ev) => {
      const a = find(document.getElementById("search-input").value);
      if (a) {
        ev.preventDefault();
        location.href = articleUrl(a.title);
      }
    });
    document.getElementById("footer").innerHTML =
      "<p>Text is available under the Creative Commons Attribution-ShareAlike License. Lexica is a demonstration " +
      'encyclopedia with 30 articles.</p><p><a href="about.html">About Lexica</a> · <a href="about.html#disclaimer">Disclaimers</a></p>';
  }

  window.Wiki = {
    articles, slug, fromSlug, find, articleUrl, categoryUrl, param, escapeHtml, inline, paragraphs, plain,
    fullText, allCategories, renderChrome,
  };
})();
