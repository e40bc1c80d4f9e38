// Member profile: user.html?u=<username>
(function () {
  "use strict";
  Forum.renderChrome("members");
  const main = document.getElementById("main");
  const u = Forum.user(Forum.param("u"));
  const esc = Forum.escapeHtml;
  if (!u) {
    main.innerHTML = '<h1>Member not found</h1><p><a href="users.html">See all members</a></p>';
    return;
  }
  document.title = u.name + " – Members – Townsquare";
  const started = Forum.threads.filter((t) => t.author === u.name).sort((a, b) => b.id - a.id);
  const repliedIn = Forum.threads.filter((t) => t.replies.some((r) => r.author === u.name)).sort((a, b) => b.id - a.id);
  const link = (t) => '<li><a href="thread.html?id=' + t.id + '">' + esc(t.title) + '</a> <span class="by">in ' + Forum.board(t.board).name + "</span></li>";
  main.innerHTML = '<div class="breadcrumb"><a href="users.html">Members</a> › ' + esc(u.name) + "</div>" +
    '<section class="profile">' + Forum.avatar(u.name, 96) + '<div><h1 id="profile-name">' + esc(u.name) + "</h1>" +
    '<table class="facts"><tr><th>Role</th><td id="profile-role">' + u.role + '</td></tr><tr><th>Joined</th><td id="profile-joined">' +
    Forum.date(u.joined) + '</td></tr><tr><th>Location</th><td id="profile-location">' + esc(u.location) + "</td></tr>" +
    '<tr><th>Posts</th><td id="profile-posts">' + Forum.postCount(u.name) + "</td></tr><tr><th>Threads started</th><td>" + started.length +
    "</td></tr></table>" + '<p class="bio">' + esc(u.bio) + "</p>" + (u.signature ? '<p class="signature">Signature: ' + esc(u.signature) + "</p>" : "") +
    "</div></section>" +
    "<h2>Threads started (" + started.length + ")</h2>" + (started.length ? '<ul class="link-list" id="started">' + started.map(link).join("") + "</ul>" : "<p>None yet.</p>") +
    "<h2>Recent replies</h2>" + (repliedIn.length ? '<ul class="link-list" id="replied">' + repliedIn.slice(0, 10).map(link).join("") + "</ul>" : "<p>None yet.</p>");
})();
