// Search: search.html?q=<words>&board=<board id>&page=N. Matches thread titles and opening posts
// that contain every word, newest first, 10 per page.
(function () {
  "use strict";
  Forum.renderChrome("");
  const esc = Forum.escapeHtml;
  const q = (Forum.param("q") || "").trim();
  const boardId = Forum.param("board") || "";
  const words = q.toLowerCase().split(/\s+/).filter(Boolean);
  const hits = words.length ? Forum.threads.filter((t) => (!boardId || t.board === boardId) &&
    words.every((w) => (t.title + " " + t.body).toLowerCase().includes(w))).sort((a, b) => b.id - a.id) : [];
  const page = Forum.paginate(hits, parseInt(Forum.param("page"), 10), (n) =>
    "search.html?q=" + encodeURIComponent(q) + (boardId ? "&board=" + boardId : "") + "&page=" + n);
  document.title = (q ? q + " – " : "") + "Search – Townsquare";
  document.getElementById("search-area").innerHTML =
    '<form class="toolbar" id="search-form" action="search.html" method="get"><label for="search-q">Search for</label>' +
    '<input id="search-q" name="q" type="search" value="' + esc(q) + '"><label for="board">in</label><select id="board" name="board">' +
    '<option value="">All boards</option>' + Forum.boards.map((b) => '<option value="' + b.id + '"' + (b.id === boardId ? " selected" : "") +
      ">" + b.name + "</option>").join("") + '</select><button class="btn" id="search-submit" type="submit">Search</button></form>' +
    (q ? '<p id="result-count">' + hits.length + " thread" + (hits.length === 1 ? "" : "s") + " found for <b>" + esc(q) + "</b>" +
      (boardId ? " in " + esc(Forum.board(boardId).name) : "") + ".</p>" : "<p>Type a word to search thread titles and posts.</p>") +
    (hits.length ? Forum.threadTable(page.items, true) + page.html : "");
})();
