// Board page: board.html?b=<board id>&page=N&sort=<activity|replies|views|newest>
(function () {
  "use strict";
  Forum.renderChrome("forums");
  const main = document.getElementById("main");
  const b = Forum.board(Forum.param("b"));
  const esc = Forum.escapeHtml;
  if (!b) {
    main.innerHTML = '<h1>Board not found</h1><p><a href="index.html">Back to the forum index</a></p>';
    return;
  }
  const sort = Forum.param("sort") || "activity";
  const SORTS = {
    activity: ["Latest activity", (x, y) => (y.pinned - x.pinned) || Forum.byActivity(x, y)],
    replies: ["Replies (most first)", (x, y) => Forum.allReplies(y).length - Forum.allReplies(x).length || y.id - x.id],
    views: ["Views (most first)", (x, y) => y.views - x.views],
    newest: ["Newest threads", (x, y) => y.id - x.id],
  };
  const order = (SORTS[sort] || SORTS.activity)[1];
  const list = Forum.threads.filter((t) => t.board === b.id).sort(order);
  const page = Forum.paginate(list, parseInt(Forum.param("page"), 10), (n) =>
    "board.html?b=" + b.id + (sort !== "activity" ? "&sort=" + sort : "") + "&page=" + n);
  document.title = b.name + (page.current > 1 ? " (page " + page.current + ")" : "") + " – Townsquare";
  main.innerHTML = '<div class="breadcrumb"><a href="index.html">Forums</a> › ' + esc(b.name) + "</div>" +
    "<h1>" + esc(b.name) + '</h1><p class="description">' + esc(b.description) + "</p>" +
    '<form class="toolbar" id="sort-form" action="board.html" method="get"><input type="hidden" name="b" value="' + b.id + '">' +
    '<label for="sort">Sort by</label><select id="sort" name="sort">' + Object.entries(SORTS).map(([k, v]) =>
      '<option value="' + k + '"' + (k === sort ? " selected" : "") + ">" + v[0] + "</option>").join("") + "</select>" +
    '<span class="count">' + list.length + " threads</span></form>" +
    Forum.threadTable(page.items, false) + page.html;
  const form = document.getElementById("sort-form");
  form.sort.addEventListener("change", () => form.submit());
})();
