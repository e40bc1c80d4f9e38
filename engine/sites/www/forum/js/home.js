// Forum index: boards with thread and post counts, plus the five most recently active threads.
(function () {
  "use strict";
  Forum.renderChrome("forums");
  const esc = Forum.escapeHtml;
  document.getElementById("board-list").innerHTML = Forum.boards.map((b) => {
    const list = Forum.threads.filter((t) => t.board === b.id);
    const posts = list.reduce((n, t) => n + 1 + Forum.allReplies(t).length, 0);
    const last = list.slice().sort(Forum.byActivity)[0];
    return '<tr class="board-row" data-board="' + b.id + '"><td class="topic"><a class="board-link" href="board.html?b=' + b.id + '">' +
      esc(b.name) + '</a><div class="by">' + esc(b.description) + '</div></td><td class="num">' + list.length + '</td><td class="num">' +
      posts + '</td><td class="last"><a href="thread.html?id=' + last.id + '">' + esc(last.title) + "</a><br>" +
      Forum.date(Forum.lastPost(last).date) + "</td></tr>";
  }).join("");
  const latest = Forum.threads.slice().sort(Forum.byActivity).slice(0, 5);
  document.getElementById("latest-list").innerHTML = latest.map((t) => '<li><a href="thread.html?id=' + t.id + '">' + esc(t.title) +
    '</a><div class="by">' + Forum.date(Forum.lastPost(t).date) + " · " + Forum.board(t.board).name + "</div></li>").join("");
  const posts = Forum.threads.reduce((n, t) => n + 1 + Forum.allReplies(t).length, 0);
  document.getElementById("stats").innerHTML = "<li>Threads: <b>" + Forum.threads.length + "</b></li><li>Posts: <b>" + posts +
    "</b></li><li>Members: <b>" + Forum.users.length + '</b></li><li>Newest member: <a href="user.html?u=shutterbug">shutterbug</a></li>';
})();
