"""JavaScript the worker installs in every page (once per context, as an init script).

It gives the worker an event-driven settle check: ``window.__wgSettle(quietMs, idleCapMs)`` resolves
when the document has loaded, no fetch/XHR is pending and the DOM has not changed for ``quietMs``
("quiet"); "busy" when that never happens within ``idleCapMs``; "navigating" as soon as the document
starts to leave (the Navigation API's navigate event, or pagehide). No polling: timers are only
re-armed by mutations and network events.
It also keeps the episode in one tab, like the original: links and forms with a target open in the
same tab and ``window.open`` navigates the current page.
"""

# Longest title a page reports: a page may set one of any length, every settle reads it, and a reply must stay under
# the message cap (the engine keeps 512 characters by default: RunConfig.page_limits).
TITLE_CHARS = 4096

INIT_SCRIPT = r"""
(() => {
  // A new window is cut from its opener before it loads (Playwright runs this in its first, empty document before
  // letting it navigate): its first request then waits for the worker's popup guard (browserpool/popup_guard.py).
  if (window.opener) window.opener = null;
  if (window.__wgSettle) return;
  // The page's own scripts run after this one and may replace any global or prototype method (a framework that
  // patches Promise and timers, or a hostile page). What the worker calls is captured here, before they run, and
  // its two entry points cannot be replaced.
  const W = window, D = document, L = location, apply = Reflect.apply, define = Object.defineProperty;
  const P = Promise, Str = String;
  const perf = performance, now = Performance.prototype.now, entriesByType = Performance.prototype.getEntriesByType;
  const setT = W.setTimeout, clearT = W.clearTimeout, max = Math.max, min = Math.min;
  const getter = (proto, name) => (Object.getOwnPropertyDescriptor(proto, name) || {}).get;
  const titleOf = getter(Document.prototype, 'title'), readyStateOf = getter(Document.prototype, 'readyState');
  const statusOf = W.PerformanceResourceTiming && getter(PerformanceResourceTiming.prototype, 'responseStatus');
  const slice = String.prototype.slice, pFinally = P.prototype.finally;
  const setAdd = Set.prototype.add, setDelete = Set.prototype.delete, setForEach = Set.prototype.forEach;
  const time = () => apply(now, perf, []);
  const later = (f, ms) => apply(setT, W, [f, ms]);
  const cancel = (t) => apply(clearT, W, [t]);

  let pending = 0, lastChange = time(), leaving = false;
  const wake = new Set();
  const poke = () => { lastChange = time(); apply(setForEach, wake, [(f) => f()]); };

  // [url, title (at most __TITLE_CHARS__ characters), HTTP status or null] (location and its href cannot be
  // replaced), after the settle state if one is given. Its own `then` is undefined: a promise resolved with it
  // would call a `then` a page gave Object.prototype.
  const where = (state) => {
    const nav = apply(entriesByType, perf, ['navigation'])[0];
    const href = L.href, title = apply(slice, Str(apply(titleOf, D, [])), [0, __TITLE_CHARS__]);
    const status = (nav && statusOf && apply(statusOf, nav, [])) || null;
    const out = state === undefined ? [href, title, status] : [state, href, title, status];
    define(out, 'then', { value: undefined });
    return out;
  };
  const fixed = (name, value) => define(W, name, { value, writable: false, configurable: false });
  fixed('__wgWhere', () => where());

  const origFetch = window.fetch;
  if (origFetch) {
    window.fetch = function (...args) {
      pending++; poke();
      return apply(pFinally, apply(origFetch, this, args), [() => { pending--; poke(); }]);
    };
  }
  const origSend = XMLHttpRequest.prototype.send;
  XMLHttpRequest.prototype.send = function (...args) {
    pending++; poke();
    this.addEventListener('loadend', () => { pending--; poke(); }, { once: true });
    return apply(origSend, this, args);
  };

  const observe = () => new MutationObserver(poke).observe(document, {
    subtree: true, childList: true, attributes: true, characterData: true });
  if (document.documentElement) observe(); else document.addEventListener('DOMContentLoaded', observe);
  document.addEventListener('readystatechange', poke);

  const markLeaving = (e) => {
    if (e && e.navigationType === 'push' && e.hashChange) return;
    if (e && e.destination && e.destination.sameDocument) return;
    if (e && e.downloadRequest != null) return;  // <a download>: the document stays
    leaving = true; poke();
  };
  // The worker calls this when a navigation turned into a download (refused): the document stays after all.
  fixed('__wgStay', () => { leaving = false; poke(); });
  if (window.navigation) window.navigation.addEventListener('navigate', markLeaving);
  window.addEventListener('pagehide', () => markLeaving());
  window.addEventListener('beforeunload', () => markLeaving());

  // One tab per episode: targets become _self, window.open navigates in place.
  const selfTarget = (e) => {
    const el = e.target && e.target.closest && e.target.closest('a[target], form[target]');
    if (el) el.target = '_self';
  };
  document.addEventListener('click', selfTarget, true);
  document.addEventListener('submit', selfTarget, true);
  window.open = (url) => { if (url) location.href = url; return window; };

  // Resolves with [state, ...where()].
  fixed('__wgSettle', (quietMs, idleCapMs) => new P((resolve) => {
    const start = time();
    let timer = null;
    const finish = (v) => { apply(setDelete, wake, [check]); cancel(timer); resolve(where(v)); };
    const check = () => {
      if (leaving) return finish('navigating');
      const t = time();
      if (t - start >= idleCapMs) return finish('busy');
      cancel(timer);
      if (apply(readyStateOf, D, []) === 'complete' && pending === 0) {
        // Quiet since the check began, too: a reaction the action scheduled on a timer (a first
        // mutation 10 ms after a click) must not be missed because the DOM was quiet before it.
        const quietFor = t - max(lastChange, start);
        if (quietFor >= quietMs) return finish('quiet');
        timer = later(check, min(quietMs - quietFor, idleCapMs - (t - start)) + 1);
      } else {
        timer = later(check, idleCapMs - (t - start) + 1);
      }
    };
    apply(setAdd, wake, [check]);
    check();
  }));
})();
""".replace("__TITLE_CHARS__", str(TITLE_CHARS))

# Centre of the first visible element matching a selector, in viewport CSS pixels, plus whether it
# lies inside the viewport. Used by the scripted policy and by selector-targeted actions.
LOCATE_FN = r"""
(sel) => {
  let el;
  try { el = document.querySelector(sel); } catch (e) { return { error: 'bad selector: ' + e.message }; }
  const all = el ? Array.from(document.querySelectorAll(sel)) : [];
  for (const cand of all) {
    const r = cand.getBoundingClientRect();
    const style = getComputedStyle(cand);
    if (r.width < 1 || r.height < 1 || style.visibility === 'hidden' || style.display === 'none') continue;
    const x = r.left + r.width / 2, y = r.top + r.height / 2;
    return { found: true, x, y, width: r.width, height: r.height,
             inView: y >= 0 && y < innerHeight && x >= 0 && x < innerWidth,
             below: y >= innerHeight, viewportHeight: innerHeight };
  }
  return { found: false };
}
"""

# Scroll the scrollable element under (x, y), or the window when there is none.
SCROLL_FN = r"""
([dy, x, y]) => {
  let el = (x === null) ? null : document.elementFromPoint(x, y);
  while (el && el !== document.body && el !== document.documentElement) {
    const s = getComputedStyle(el);
    if (/(auto|scroll)/.test(s.overflowY) && el.scrollHeight > el.clientHeight) {
      el.scrollBy({ top: dy, behavior: 'instant' });
      return 'element';
    }
    el = el.parentElement;
  }
  window.scrollBy({ top: dy, behavior: 'instant' });
  return 'window';
}
"""

# The element at a top-level viewport point, found through same-origin iframes and open shadow roots
# (document.elementFromPoint stops at an iframe or a shadow host). A JS function expression, pasted into
# the functions below. Returns null when nothing is there.
_DEEP_HIT = r"""
(x, y) => {
  let hit = document.elementFromPoint(x, y), ox = 0, oy = 0;
  for (let guard = 0; hit && guard < 64; guard++) {
    if (hit.shadowRoot) {
      const inner = hit.shadowRoot.elementFromPoint(x - ox, y - oy);
      if (inner && inner !== hit) { hit = inner; continue; }
    }
    if (hit.tagName === 'IFRAME' || hit.tagName === 'FRAME') {
      let doc = null;
      try { doc = hit.contentDocument; } catch (e) { doc = null; }
      if (doc) {
        const r = hit.getBoundingClientRect(), cs = hit.ownerDocument.defaultView.getComputedStyle(hit);
        ox += r.left + hit.clientLeft + parseFloat(cs.paddingLeft);
        oy += r.top + hit.clientTop + parseFloat(cs.paddingTop);
        const inner = doc.elementFromPoint(x - ox, y - oy);
        if (inner) { hit = inner; continue; }
      }
    }
    break;
  }
  return hit;
}
"""

# Set-of-Marks: the visible interactive elements of the page, in document order (shadow roots and
# same-origin iframes in the place of their host), as [tag, text, x, y, w, h] (an input's tag with its type, as
# "input, type=text") in top-level viewport CSS
# px, clipped to the viewport; plus the viewport's CSS size, and why the pass stopped early ('count': maxCount
# elements found, 'time': budgetMs spent; null: it did not). One querySelectorAll per document/shadow root and
# getBoundingClientRect / checkVisibility / elementFromPoint per candidate only: layout is computed once, nothing
# writes to the DOM.
SOM_FN = r"""
([maxText, maxCount, budgetMs, keep]) => {
  const deepHit = __DEEP_HIT__;
  const t0 = performance.now();
  let cut = null;
  const vw = innerWidth, vh = innerHeight, maxArea = 0.9 * vw * vh;
  const TAGS = new Set(['BUTTON', 'SELECT', 'TEXTAREA', 'SUMMARY']);
  const ROLES = new Set(['button', 'link', 'checkbox', 'radio', 'menuitem', 'tab', 'switch', 'option',
    'combobox', 'textbox', 'searchbox', 'slider', 'spinbutton', 'listbox', 'menuitemcheckbox',
    'menuitemradio', 'treeitem']);
  const VIS = { checkOpacity: true, checkVisibilityCSS: true, opacityProperty: true, visibilityProperty: true };
  const clean = (s) => (s == null ? '' : String(s)).replace(/\s+/g, ' ').trim();
  const out = [], els = [];  // els: the elements themselves (kept only when asked: their tree ids are looked up)

  const interactive = (el) => {
    const tag = el.tagName;
    if (TAGS.has(tag)) return true;
    if (tag === 'A') { if (el.hasAttribute('href')) return true; }
    else if (tag === 'INPUT') return el.type !== 'hidden';
    const role = el.getAttribute('role');
    if (role && ROLES.has(role.trim().split(/\s+/)[0].toLowerCase())) return true;
    if (el.hasAttribute('onclick') || typeof el.onclick === 'function') return true;
    const ce = el.getAttribute('contenteditable');
    if (ce !== null && ce !== 'false') return true;
    const ti = el.getAttribute('tabindex');
    return ti !== null && parseInt(ti, 10) >= 0;
  };

  // Whether ``node`` is ``el`` or lies inside it, across shadow boundaries and slots (composed tree).
  const inside = (node, el) => {
    for (let n = node; n; n = n.assignedSlot || n.parentNode || n.host) if (n === el) return true;
    return false;
  };

  // Not occluded: the element (or a descendant) is what a click at its centre, or at one of a few
  // other points of its visible box, would hit.
  const reachable = (el, x0, y0, x1, y1) => {
    const w = x1 - x0, h = y1 - y0;
    const pts = [[0.5, 0.5], [0.25, 0.25], [0.75, 0.25], [0.25, 0.75], [0.75, 0.75]];
    for (const [fx, fy] of pts) if (inside(deepHit(x0 + fx * w, y0 + fy * h), el)) return true;
    return false;
  };

  const nameOf = (el) => {
    const tag = el.tagName;
    let s = '';
    const ids = el.getAttribute('aria-labelledby');
    if (ids) {
      const root = el.getRootNode();
      s = clean(ids.split(/\s+/).map((id) => {
        const n = root.getElementById ? root.getElementById(id) : null;
        return n ? n.textContent : '';
      }).join(' '));
    }
    if (!s) s = clean(el.getAttribute('aria-label'));
    if (!s && el.labels && el.labels.length) s = clean(Array.from(el.labels, (l) => l.innerText).join(' '));
    if (!s) s = clean(el.getAttribute('alt'));
    if (!s) {
      if (tag === 'INPUT') {
        const t = el.type;
        if (t === 'submit' || t === 'button' || t === 'reset') s = clean(el.value);
        else s = clean(el.placeholder) || (t === 'password' ? '' : clean(el.value));
      } else if (tag === 'TEXTAREA') {
        s = clean(el.placeholder) || clean(el.value);
      } else if (tag === 'SELECT') {
        s = el.selectedIndex >= 0 ? clean(el.options[el.selectedIndex].text) : '';
      } else {
        s = clean(el.innerText);
        if (!s) { const img = el.querySelector('img[alt]'); if (img) s = clean(img.alt); }
      }
    }
    if (!s) s = clean(el.getAttribute('title'));
    if (s.length > maxText) s = Array.from(s).slice(0, maxText - 1).join('') + '\u2026';  // whole code points
    return s.toWellFormed ? s.toWellFormed() : s;  // no lone surrogates: msgpack must encode it
  };

  // The tag as the original's element list writes it: an input with a type attribute as "input, type=text".
  const tagOf = (el) => {
    const tag = el.tagName.toLowerCase();
    return (tag === 'input' && el.hasAttribute('type')) ? tag + ', type=' + el.getAttribute('type') : tag;
  };

  // The visible part of a box, or null: clipped to the viewport (and iframe), not page-sized.
  const visible = (r, ox, oy, clip) => {
    if (r.width <= 0 || r.height <= 0) return null;
    const x0 = Math.max(r.left + ox, clip[0]), y0 = Math.max(r.top + oy, clip[1]);
    const x1 = Math.min(r.right + ox, clip[2]), y1 = Math.min(r.bottom + oy, clip[3]);
    if (x1 - x0 < 1 || y1 - y0 < 1) return null;  // outside the viewport (or its iframe)
    if ((x1 - x0) * (y1 - y0) > maxArea) return null;  // a page-sized wrapper or overlay, not a target
    return [x0, y0, x1, y1];
  };

  const consider = (el, ox, oy, clip) => {
    let box = visible(el.getBoundingClientRect(), ox, oy, clip);
    if (!box || (el.checkVisibility && !el.checkVisibility(VIS))) return;
    if (!reachable(el, ...box)) {
      // An inline element broken over lines (a wrapped link): its bounding box is mostly other text, so
      // the box of its largest reachable line fragment stands for it (its centre is a click on it).
      const frags = el.getClientRects();
      if (frags.length < 2) return;
      box = null;
      const parts = Array.from(frags).slice(0, 8).map((r) => visible(r, ox, oy, clip)).filter((b) => b)
        .sort((a, b) => (b[2] - b[0]) * (b[3] - b[1]) - (a[2] - a[0]) * (a[3] - a[1]));
      for (const b of parts) if (reachable(el, ...b)) { box = b; break; }
      if (!box) return;
    }
    const x = Math.floor(box[0]), y = Math.floor(box[1]);
    if (keep) els.push(el);
    out.push([tagOf(el), nameOf(el), x, y,
              Math.min(Math.ceil(box[2]), vw) - x, Math.min(Math.ceil(box[3]), vh) - y]);
  };

  const visit = (root, ox, oy, clip) => {
    const all = root.querySelectorAll('*');
    for (let i = 0; i < all.length && !cut; i++) {
      if ((i & 15) === 0 && performance.now() - t0 > budgetMs) { cut = 'time'; break; }
      const el = all[i];
      if (interactive(el)) {
        if (out.length >= maxCount) { cut = 'count'; break; }
        consider(el, ox, oy, clip);
      }
      if (el.shadowRoot) visit(el.shadowRoot, ox, oy, clip);
      if (el.tagName === 'IFRAME' || el.tagName === 'FRAME') {
        let doc = null;
        try { doc = el.contentDocument; } catch (e) { doc = null; }
        if (!doc || !doc.documentElement) continue;
        const r = el.getBoundingClientRect();
        const cs = el.ownerDocument.defaultView.getComputedStyle(el);
        const pl = parseFloat(cs.paddingLeft), pt = parseFloat(cs.paddingTop);
        const ix = ox + r.left + el.clientLeft + pl, iy = oy + r.top + el.clientTop + pt;
        // The iframe's own viewport (its content box), within the clip of its parent.
        const inner = [Math.max(clip[0], ix), Math.max(clip[1], iy),
                       Math.min(clip[2], ix + el.clientWidth - pl - parseFloat(cs.paddingRight)),
                       Math.min(clip[3], iy + el.clientHeight - pt - parseFloat(cs.paddingBottom))];
        if (inner[2] - inner[0] >= 1 && inner[3] - inner[1] >= 1) visit(doc, ix, iy, inner);
      }
    }
  };

  visit(document, 0, 0, [0, 0, vw, vh]);
  return keep ? [vw, vh, out, cut, els] : [vw, vh, out, cut];
}
""".replace("__DEEP_HIT__", _DEEP_HIT.strip())


def som_expression(max_text: int, max_count: int, budget_ms: int, keep: bool = False) -> str:
    """A Set-of-Marks pass as an expression: SOM_FN with its caps (element names of ``max_text`` characters, at
    most ``max_count`` elements, ``budget_ms`` of the page's time); ``keep``: the result's fifth item is the list of
    the elements themselves (for a result taken by reference)."""
    return f"({SOM_FN})([{int(max_text)}, {int(max_count)}, {int(budget_ms)}, {'true' if keep else 'false'}])"


# Choose an option of the <select> at a viewport point (through iframes and shadow roots) by its label or
# value (case-insensitive, whitespace-trimmed), then fire input and change as a user's choice would.
SELECT_FN = r"""
([x, y, text]) => {
  const deepHit = __DEEP_HIT__;
  const norm = (s) => (s == null ? '' : String(s)).replace(/\s+/g, ' ').trim().toLowerCase();
  const hit = deepHit(x, y);
  const sel = hit && hit.closest ? hit.closest('select') : null;
  if (!sel) {
    return { error: 'no <select> at (' + x + ', ' + y + ')' + (hit ? ': <' + hit.tagName.toLowerCase() + '>' : '') };
  }
  if (sel.disabled) return { error: 'the <select> at (' + x + ', ' + y + ') is disabled' };
  const want = norm(text);
  const opt = Array.from(sel.options).find((o) => !o.disabled &&
    (norm(o.label) === want || norm(o.text) === want || norm(o.value) === want));
  if (!opt) {
    const labels = Array.from(sel.options, (o) => o.label.trim()).slice(0, 20).join(', ');
    return { error: 'no option ' + JSON.stringify(String(text)) + ' in the <select> (options: ' + labels + ')' };
  }
  sel.focus();
  if (sel.multiple) { for (const o of sel.options) o.selected = (o === opt); } else { sel.selectedIndex = opt.index; }
  sel.dispatchEvent(new Event('input', { bubbles: true, composed: true }));
  sel.dispatchEvent(new Event('change', { bubbles: true }));
  return { ok: true, value: opt.value };
}
""".replace("__DEEP_HIT__", _DEEP_HIT.strip())

# Installed with INIT_SCRIPT when the network policy is on. WebRTC gathers ICE candidates over UDP straight from
# the browser (STUN/TURN servers the page names, any address), past the proxy that holds every other load to the
# policy; the page never gets the API. (Every frame runs init scripts before its own; workers have no WebRTC.)
NO_WEBRTC_SCRIPT = r"""
(() => {
  for (const name of ['RTCPeerConnection', 'webkitRTCPeerConnection', 'RTCIceTransport']) {
    try { delete window[name]; } catch (e) {}
  }
})();
"""
