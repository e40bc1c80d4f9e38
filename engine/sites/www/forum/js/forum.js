// Townsquare shared helpers: lookups over the static data, the replies and likes that this browser
// added (localStorage), date formatting, pagination and the page header.
window.Forum = (function () {
  "use strict";
  const PER_PAGE = 10;
  const KEYS = { replies: "forum.replies", likes: "forum.likes" };
  const threads = window.FORUM_THREADS;
  const boards = window.FORUM_BOARDS;
  const users = window.FORUM_USERS;
  const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

  function param(name) {
    return new URLSearchParams(location.search).get(name);
  }
  function escapeHtml(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }
  function load(key) {
    try {
      return JSON.parse(localStorage.getItem(key) || "{}");
    } catch (e) {
      return {};
    }
  }
  function save(key, value) {
    localStorage.setItem(key, JSON.stringify(value));
  }
  // "2026-01-12T14:05" -> "12 Jan 2026, 14:05" (formatted by hand so it never depends on the locale).
  function date(iso) {
    const [d, t] = iso.split("T");
    const [y, m, day] = d.split("-");
    return +day + " " + MONTHS[+m - 1] + " " + y + (t ? ", " + t.slice(0, 5) : "");
  }
  function nowIso() {
    return new Date().toISOString().slice(0, 16);
  }

  function board(id) {
    return boards.find((b) => b.id === id) || null;
  }
  function thread(id) {
    return threads.find((t) => String(t.id) === String(id)) || null;
  }
  function user(name) {
    return users.find((u) => u.name === name) || null;
  }

  // Replies added in this browser, keyed by thread id.
  function localReplies(threadId) {
    return load(KEYS.replies)[threadId] || [];
  }
  function addReply(threadId, body) {
    const all = load(KEYS.replies);
    (all[threadId] = all[threadId] || []).push({ author: "guest", date: nowIso(), body, likes: 0, local: true });
    save(KEYS.replies, all);
  }
  function allReplies(t) {
    return t.replies.concat(localReplies(t.id));
  }
  function lastPost(t) {
    const r = allReplies(t);
    return r.length ? r[r.length - 1] : { author: t.author, date: t.date };
  }
  // Likes: one key per post, "<thread id>:<post index>" (0 is the opening post).
  function liked(key) {
    return !!load(KEYS.likes)[key];
  }
  function toggleLike(key) {
    const all = load(KEYS.likes);
    if (all[key]) delete all[key];
    else all[key] = true;
    save(KEYS.likes, all);
    return !!all[key];
  }
  function postCount(name) {
    return threads.reduce((n, t) => n + (t.author === name ? 1 : 0) + t.replies.filter((r) => r.author === name).length, 0);
  }

  function avatar(name, size) {
    // Initials on a colour derived from the name: recognisable without loading any image.
    let h = 0;
    for (const c of name) h = (h * 31 + c.charCodeAt(0)) % 360;
    const initials = name.replace(/[^a-z]/gi, " ").trim().split(/\s+/).map((w) => w[0]).join("").slice(0, 2).toUpperCase() || "?";
    return '<svg class="avatar" width="' + size + '" height="' + size + '" viewBox="0 0 40 40" aria-hidden="true"><rect width="40" height="40" rx="8" fill="hsl(' +
      h + ',45%,45%)"/><text x="20" y="26" font-size="15" text-anchor="middle" fill="#fff" font-family="sans-serif">' + initials + "</text></svg>";
  }
  function userLink(name) {
    return user(name) ? '<a class="user-link" href="user.html?u=' + encodeURIComponent(name) + '">' + escapeHtml(name) + "</a>"
      : '<span class="user-link guest">' + escapeHtml(name) + "</span>";
  }

  // Pagination: returns the items on this page and the HTML of the page links.
  function paginate(items, page, hrefFor) {
    const pages = Math.max(1, Math.ceil(items.length / PER_PAGE));
    const current = Math.min(Math.max(1, page || 1), pages);
    const slice = items.slice((current - 1) * PER_PAGE, current * PER_PAGE);
    let html = "";
    if (pages > 1) {
      html = '<nav class="pagination" aria-label="Pages">' +
        (current > 1 ? '<a class="page-link prev" href="' + hrefFor(current - 1) + '">« Previous</a>' : "") +
        Array.from({ length: pages }, (_, i) => i + 1).map((n) => n === current
          ? '<span class="page-link current" aria-current="page">' + n + "</span>"
          : '<a class="page-link" data-page="' + n + '" href="' + hrefFor(n) + '">' + n + "</a>").join("") +
        (current < pages ? '<a class="page-link next" href="' + hrefFor(current + 1) + '">Next »</a>' : "") +
        '<span class="page-info">Page ' + current + " of " + pages + "</span></nav>";
    }
    return { items: slice, html, current, pages };
  }
  function threadRow(t, showBoard) {
    const last = lastPost(t);
    return '<tr class="thread-row" data-thread="' + t.id + '"><td class="topic">' + (t.pinned ? '<span class="badge pinned">Pinned</span> ' : "") +
      '<a class="thread-link" href="thread.html?id=' + t.id + '">' + escapeHtml(t.title) + "</a>" +
      '<div class="by">by ' + userLink(t.author) + " · " + date(t.date) + (showBoard ? ' · in <a href="board.html?b=' + t.board + '">' +
      board(t.board).name + "</a>" : "") + '</div></td><td class="num replies">' + allReplies(t).length + '</td><td class="num views">' +
      t.views.toLocaleString("en-US") + '</td><td class="last">' + date(last.date) + "<br>by " + userLink(last.author) + "</td></tr>";
  }
  function threadTable(list, showBoard) {
    return '<table class="threads"><thead><tr><th>Topic</th><th class="num">Replies</th><th class="num">Views</th><th>Last post</th></tr></thead><tbody>' +
      list.map((t) => threadRow(t, showBoard)).join("") + "</tbody></table>";
  }
  function byActivity(a, b) {
    return lastPost(b).date.localeCompare(lastPost(a).date) || b.id - a.id;
  }

  function renderChrome(active) {
    const link = (href, id, label) => '<a href="' + href + '"' + (active === id ? ' class="active"' : "") + ">" + label + "</a>";
    document.getElementById("site-header").innerHTML =
      '<div class="wrap header-row"><a class="logo" href="index.html"><img src="img/logo.svg" alt="" width="38" height="38">Townsquare</a>' +
      '<form class="search" action="search.html" method="get" role="search"><input id="search-input" type="search" name="q" ' +
      'placeholder="Search threads" aria-label="Search threads" value="' + escapeHtml(param("q") || "") + '">' +
      '<button id="search-button" type="submit">Search</button></form><span class="whoami">Signed in as <b>guest</b></span></div>' +
      '<nav class="mainnav"><div class="wrap">' + link("index.html", "forums", "Forums") + link("latest.html", "latest", "Latest") +
      link("users.html", "members", "Members") + link("rules.html", "rules", "Rules") + "</div></nav>";
    document.getElementById("site-footer").innerHTML = '<div class="wrap">Townsquare community forum · ' + threads.length + " threads · " +
      users.length + " members shown · All times are UTC</div>";
  }

  return { PER_PAGE, param, escapeHtml, date, board, thread, user, boards, users, threads, localReplies, addReply, allReplies,
    lastPost, liked, toggleLike, postCount, avatar, userLink, paginate, threadTable, byActivity, renderChrome };
})();
