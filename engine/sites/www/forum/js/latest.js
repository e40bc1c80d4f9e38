// Latest: every thread across the forum by most recent activity, 10 per page.
(function () {
  "use strict";
  Forum.renderChrome("latest");
  const list = Forum.threads.slice().sort(Forum.byActivity);
  const page = Forum.paginate(list, parseInt(Forum.param("page"), 10), (n) => "latest.html?page=" + n);
  document.title = "Latest threads" + (page.current > 1 ? " (page " + page.current + ")" : "") + " – Townsquare";
  document.getElementById("latest-area").innerHTML = Forum.threadTable(page.items, true) + page.html;
})();
