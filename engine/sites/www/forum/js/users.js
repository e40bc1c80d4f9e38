// Member list, alphabetical.
(function () {
  "use strict";
  Forum.renderChrome("members");
  const esc = Forum.escapeHtml;
  document.getElementById("member-rows").innerHTML = Forum.users.slice().sort((a, b) => a.name.localeCompare(b.name)).map((u) =>
    '<tr data-user="' + u.name + '"><td>' + Forum.avatar(u.name, 28) + " " + Forum.userLink(u.name) + "</td><td>" + u.role + "</td><td>" +
    Forum.date(u.joined) + "</td><td>" + esc(u.location) + '</td><td class="num">' + Forum.postCount(u.name) + "</td></tr>").join("");
})();
