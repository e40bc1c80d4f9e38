// Skyway Travel shared helpers: URL parameters, money, the bookings kept in localStorage, the
// airport <select> options and the page header/footer.
window.Site = (function () {
  "use strict";
  const BOOKINGS = "travel.bookings";

  function param(name) {
    return new URLSearchParams(location.search).get(name);
  }
  function params() {
    return Object.fromEntries(new URLSearchParams(location.search).entries());
  }
  function query(obj) {
    return Object.entries(obj).filter(([, v]) => v !== undefined && v !== null && v !== "")
      .map(([k, v]) => encodeURIComponent(k) + "=" + encodeURIComponent(v)).join("&");
  }
  function escapeHtml(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }
  function money(n) {
    return "$" + n.toLocaleString("en-US", { minimumFractionDigits: 0, maximumFractionDigits: 2 });
  }
  function bookings() {
    try {
      return JSON.parse(localStorage.getItem(BOOKINGS) || "[]");
    } catch (e) {
      return [];
    }
  }
  function saveBookings(list) {
    localStorage.setItem(BOOKINGS, JSON.stringify(list));
  }
  function airportLabel(code) {
    const a = Inventory.airport(code);
    return a ? a.city + " (" + a.code + ")" : code;
  }
  // Option labels start with the city name, so typing the city into the open list selects it.
  function airportOptions(selected, placeholder) {
    return '<option value="">' + placeholder + "</option>" + window.TRAVEL_AIRPORTS.map((a) =>
      '<option value="' + a.code + '"' + (a.code === selected ? " selected" : "") + ">" + a.city + " (" + a.code + ")</option>").join("");
  }
  function isDate(s) {
    return /^\d{4}-\d{2}-\d{2}$/.test(s || "") && !isNaN(Date.parse(s));
  }
  // Shows a list of validation messages in the given box and marks the offending fields.
  function showErrors(box, errors) {
    document.querySelectorAll(".field.invalid").forEach((f) => f.classList.remove("invalid"));
    errors.forEach((e) => {
      const field = document.getElementById(e.field);
      if (field && field.closest(".field")) field.closest(".field").classList.add("invalid");
    });
    box.innerHTML = errors.length
      ? '<div class="alert" role="alert"><strong>Please check your details:</strong><ul>' +
        errors.map((e) => "<li>" + e.text + "</li>").join("") + "</ul></div>"
      : "";
  }

  function renderChrome(active) {
    const link = (href, id, label) => '<a href="' + href + '"' + (active === id ? ' class="active"' : "") + ">" + label + "</a>";
    document.getElementById("site-header").innerHTML =
      '<div class="wrap header-row"><a class="logo" href="index.html"><img src="img/logo.svg" alt="" width="34" height="34">' +
      "<span>Skyway <em>Travel</em></span></a><nav>" + link("index.html", "flights", "Flights") + link("hotels.html", "hotels", "Hotels") +
      link("trips.html", "trips", "My trips (" + bookings().filter((b) => b.status === "confirmed").length + ")") +
      link("help.html", "help", "Help") + "</nav></div>";
    document.getElementById("site-footer").innerHTML =
      '<div class="wrap"><p>Skyway Travel Ltd · 88 Aviation Way, Dublin · Customer care +1 800 555 0199 (24 hours)</p>' +
      "<p>All prices are in US dollars and include taxes unless stated otherwise. © 2026 Skyway Travel.</p></div>";
  }

  return { param, params, query, escapeHtml, money, bookings, saveBookings, airportLabel, airportOptions, isDate, showErrors, renderChrome };
})();
