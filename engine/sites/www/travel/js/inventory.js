// Deterministic flight and hotel inventory. Every number shown on the site (times, prices, seats,
// booking references) is derived from the search inputs through a seeded generator, so the same
// search always shows the same results in every episode.
window.Inventory = (function () {
  "use strict";

  // FNV-1a string hash -> 32-bit seed.
  function hash(text) {
    let h = 0x811c9dc5;
    for (let i = 0; i < text.length; i++) {
      h ^= text.charCodeAt(i);
      h = Math.imul(h, 0x01000193) >>> 0;
    }
    return h >>> 0;
  }
  // mulberry32: a small, well-distributed PRNG.
  function rng(seedText) {
    let a = hash(seedText);
    return function () {
      a = (a + 0x6d2b79f5) >>> 0;
      let t = a;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
  }

  const airports = new Map(window.TRAVEL_AIRPORTS.map((a) => [a.code, a]));
  function airport(code) {
    return airports.get(code) || null;
  }
  function cabin(id) {
    return window.TRAVEL_CABINS.find((c) => c.id === id) || null;
  }
  // Great-circle distance in km.
  function distance(a, b) {
    const rad = Math.PI / 180;
    const dLat = (b.lat - a.lat) * rad;
    const dLon = (b.lon - a.lon) * rad;
    const h = Math.sin(dLat / 2) ** 2 + Math.cos(a.lat * rad) * Math.cos(b.lat * rad) * Math.sin(dLon / 2) ** 2;
    return 2 * 6371 * Math.asin(Math.sqrt(h));
  }
  function clock(minutes) {
    const m = ((minutes % 1440) + 1440) % 1440;
    return String(Math.floor(m / 60)).padStart(2, "0") + ":" + String(m % 60).padStart(2, "0");
  }
  function duration(minutes) {
    return Math.floor(minutes / 60) + "h " + String(minutes % 60).padStart(2, "0") + "m";
  }

  // All flights from -> to on a date (YYYY-MM-DD), in the given cabin, sorted by departure time.
  function flights(from, to, date, cabinId) {
    const a = airport(from);
    const b = airport(to);
    const c = cabin(cabinId) || cabin("economy");
    if (!a || !b || from === to || !/^\d{4}-\d{2}-\d{2}$/.test(date)) return [];
    const km = distance(a, b);
    const rand = rng(from + "-" + to + "-" + date);
    const count = 5 + Math.floor(rand() * 3);
    const list = [];
    const used = new Set();
    for (let i = 0; i < count; i++) {
      const airline = window.TRAVEL_AIRLINES[Math.floor(rand() * window.TRAVEL_AIRLINES.length)];
      let number = airline.code + (100 + Math.floor(rand() * 900));
      while (used.has(number)) number = airline.code + (100 + Math.floor(rand() * 900));
      used.add(number);
      const depart = 6 * 60 + Math.round((rand() * 16 * 60) / 5) * 5;
      // A connection goes through one of the two hubs with the smallest detour, like a real network;
      // when every hub is a long detour the route is flown nonstop only.
      const hubs = window.TRAVEL_HUBS.filter((h) => h !== from && h !== to)
        .map((h) => ({ h, km: distance(a, airport(h)) + distance(airport(h), b) }))
        .sort((x, y) => x.km - y.km)
        .filter((x) => x.km <= km * 1.35 + 400);
      const nonstopShare = km < 1500 ? 0.8 : km < 7000 ? 0.55 : 0.3;
      const stops = hubs.length && rand() >= nonstopShare ? 1 : 0;
      const hub = stops ? hubs[Math.floor(rand() * Math.min(2, hubs.length))] : null;
      const flown = hub ? hub.km : km;
      const via = hub ? hub.h : null;
      const minutes = Math.round((flown / 780 * 60 + 35 + (stops ? 25 + 60 + rand() * 90 : 0)) / 5) * 5;
      const base = 45 + km * 0.085 * (0.75 + rand() * 0.7) - stops * 25;
      const seats = 1 + Math.floor(rand() * 9);
      const arrive = depart + minutes + (b.tz - a.tz) * 60;
      list.push({
        id: number + "-" + date, number, airline: airline.name, from, to, date, cabin: c.id,
        depart, arrive, dayOffset: Math.floor(arrive / 1440), departTime: clock(depart), arriveTime: clock(arrive),
        minutes, durationText: duration(minutes), stops, via, seats,
        price: Math.max(39, Math.round(base * c.factor)),
      });
    }
    return list.sort((x, y) => x.depart - y.depart);
  }
  function findFlight(id, from, to, cabinId) {
    if (!id) return null;
    const date = id.slice(id.indexOf("-") + 1);
    return flights(from, to, date, cabinId).find((f) => f.id === id) || null;
  }

  // Hotels in a city (airport code): six per city with fixed nightly prices.
  function hotels(code) {
    const a = airport(code);
    if (!a) return [];
    const rand = rng("hotels-" + code);
    const names = window.TRAVEL_HOTEL_NAMES.slice();
    const cityFactor = { DXB: 1.25, LHR: 1.3, JFK: 1.45, CDG: 1.3, HND: 1.15, SIN: 1.2, SYD: 1.15 }[code] || 1;
    const list = [];
    for (let i = 0; i < 6; i++) {
      const name = names.splice(Math.floor(rand() * names.length), 1)[0].replace("{city}", a.city);
      const stars = 2 + Math.floor(rand() * 4);
      const rating = Math.round((6.8 + rand() * 2.8 + (stars - 3) * 0.15) * 10) / 10;
      const amenities = window.TRAVEL_AMENITIES.filter(() => rand() < 0.5);
      list.push({
        id: code.toLowerCase() + "-" + (i + 1), name, city: a.city, code, stars, rating: Math.min(rating, 9.8),
        price: Math.round((35 + stars * 38 + rand() * 60) * cityFactor),
        distance: Math.round((0.3 + rand() * 7.5) * 10) / 10,
        amenities: amenities.length ? amenities : ["Free Wi-Fi"],
      });
    }
    return list;
  }
  function findHotel(id) {
    if (!id) return null;
    return hotels(id.split("-")[0].toUpperCase()).find((h) => h.id === id) || null;
  }

  // Booking reference: six characters from an alphabet without look-alike letters and digits.
  function reference(text) {
    const alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let h = hash(text.toLowerCase());
    let h2 = hash("ref:" + text.toLowerCase());
    let out = "";
    for (let i = 0; i < 6; i++) {
      out += alphabet[(i < 3 ? h : h2) % alphabet.length];
      if (i < 3) h = Math.floor(h / alphabet.length);
      else h2 = Math.floor(h2 / alphabet.length);
    }
    return out;
  }

  function nights(checkin, checkout) {
    const a = Date.parse(checkin + "T00:00:00Z");
    const b = Date.parse(checkout + "T00:00:00Z");
    return Math.round((b - a) / 86400000);
  }
  function longDate(iso) {
    const d = new Date(iso + "T12:00:00Z");
    return d.toLocaleDateString("en-US", { weekday: "short", day: "numeric", month: "short", year: "numeric", timeZone: "UTC" });
  }

  return { hash, rng, airport, cabin, distance, flights, findFlight, hotels, findHotel, reference, nights, longDate, clock };
})();
