// Thread page: thread.html?id=<thread id>. Shows the opening post and replies, a like button per
// post and a reply form; new replies and likes are kept in this browser's localStorage.
(function () {
  "use strict";
  Forum.renderChrome("forums");
  const main = document.getElementById("main");
  const t = Forum.thread(Forum.param("id"));
  const esc = Forum.escapeHtml;
  if (!t) {
    main.innerHTML = '<h1>Thread not found</h1><p>This thread may have been removed. <a href="index.html">Back to the forum index</a></p>';
    document.title = "Thread not found – Townsquare";
    return;
  }
  const b = Forum.board(t.board);
  document.title = t.title + " – " + b.name + " – Townsquare";

  function post(p, index) {
    const key = t.id + ":" + index;
    const isLiked = Forum.liked(key);
    const u = Forum.user(p.author);
    return '<article class="post' + (index === 0 ? " opening" : "") + (p.local ? " mine" : "") + '" id="post-' + index + '" data-post="' + index + '">' +
      '<aside class="author">' + Forum.avatar(p.author, 56) + "<div>" + Forum.userLink(p.author) + "</div>" +
      (u ? '<div class="role">' + u.role + '</div><div class="meta">Posts: ' + Forum.postCount(u.name) + "</div>" : '<div class="role">Guest</div>') +
      '</aside><div class="post-body"><div class="post-date">' + (index === 0 ? "Posted " : "Replied ") + Forum.date(p.date) +
      ' <a class="permalink" href="#post-' + index + '">#' + (index + 1) + "</a></div>" +
      '<div class="text">' + esc(p.body).replace(/\n/g, "<br>") + "</div>" +
      (u && u.signature ? '<div class="signature">' + esc(u.signature) + "</div>" : "") +
      '<div class="post-actions"><button type="button" class="like-button' + (isLiked ? " liked" : "") + '" data-key="' + key +
      '" aria-pressed="' + isLiked + '">' + (isLiked ? "♥ Liked" : "♡ Like") + ' (<span class="like-count">' + ((p.likes || 0) + (isLiked ? 1 : 0)) +
      "</span>)</button></div></div></article>";
  }

  function render(message) {
    const replies = Forum.allReplies(t);
    const opening = { author: t.author, date: t.date, body: t.body, likes: t.likes };
    main.innerHTML = '<div class="breadcrumb"><a href="index.html">Forums</a> › <a href="board.html?b=' + b.id + '">' + esc(b.name) +
      "</a> › " + esc(t.title) + "</div>" +
      '<h1 id="thread-title">' + esc(t.title) + "</h1>" +
      '<div class="thread-meta">Started by ' + Forum.userLink(t.author) + " · " + Forum.date(t.date) + ' · <span id="reply-count">' +
      replies.length + " " + (replies.length === 1 ? "reply" : "replies") + "</span> · " + t.views.toLocaleString("en-US") + " views</div>" +
      [opening].concat(replies).map(post).join("") +
      '<section class="reply-box" id="reply-section"><h2>Post a reply</h2>' + (message ? message : "") +
      '<form id="reply-form" novalidate><label for="reply-text">Your reply (posting as guest)</label>' +
      '<textarea id="reply-text" name="reply" rows="5" placeholder="Write something helpful..."></textarea>' +
      '<button class="btn" id="post-reply" type="submit">Post reply</button></form></section>';
  }

  // Delegated handlers survive re-rendering.
  main.addEventListener("click", (ev) => {
    const button = ev.target.closest(".like-button");
    if (!button) return;
    Forum.toggleLike(button.dataset.key);
    const y = window.scrollY;
    render("");
    window.scrollTo(0, y);
  });
  main.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = document.getElementById("reply-text").value.trim();
    if (text.length < 2) {
      render('<div class="alert" role="alert" id="reply-error">Your reply is empty. Please write at least 2 characters.</div>');
      document.getElementById("reply-section").scrollIntoView();
      return;
    }
    if (text.length > 2000) {
      render('<div class="alert" role="alert" id="reply-error">Replies are limited to 2000 characters.</div>');
      return;
    }
    Forum.addReply(t.id, text);
    render('<div class="notice" id="reply-posted">Your reply has been posted.</div>');
    const mine = main.querySelectorAll(".post.mine");
    mine[mine.length - 1].scrollIntoView();
  });
  render("");
  if (location.hash) {
    const target = document.getElementById(location.hash.slice(1));
    if (target) target.scrollIntoView();
  }
})();
