"""Generate the "heavy" page profile under ``engine/sites/www/heavy/`` (committed; rerun to regenerate).

    python -m bench.make_heavy_site [--out engine/sites/www/heavy]

The bundled sites are light (a few hundred DOM nodes, a handful of images). Real shop and news pages
are not, so the benchmark suites also run on two pages that look like them:

* ``shop.html``: a storefront rendered by script from ``data/products.json`` (300 products): mega menu,
  filter sidebar, a grid of every product (image, name, price, rating stars, tags, add-to-cart button),
  a recommendations strip fetched after the page has loaded, a big footer; ``?item=ID`` shows one product
  with its reviews and a related-products grid; ``?sort=`` and ``?cat=`` re-order the grid.
* ``news.html``: a news front page rendered from ``data/articles.json`` (150 articles): section nav,
  lead stories, a card per article (image, headline, byline, summary, tag links), a "most read" and a
  "live" sidebar; ``?article=N`` shows one article (long body) and the related headlines.

Both pages link to each other and to their detail views, so a random agent has navigating steps as well
as in-page ones (add to cart, section tabs, sort). Images: 48 SVG and 24 PNG files, all distinct and small.
Everything is generated from a fixed seed, so regenerating gives the same bytes.
"""

from __future__ import annotations

import argparse
import json
import random
import struct
import zlib
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "engine" / "sites" / "www" / "heavy"
N_PRODUCTS = 300
N_ARTICLES = 150
N_SVG = 48
N_PNG = 24
CATEGORIES = ["Kitchen", "Garden", "Outdoor", "Toys", "Books", "Audio", "Office", "Bath", "Lighting", "Pets",
              "Tools", "Sports"]
SECTIONS = ["World", "Business", "Science", "Tech", "Culture", "Sport", "Travel", "Food", "Health", "Opinion"]
ADJ = ["Classic", "Compact", "Deluxe", "Everyday", "Handmade", "Modern", "Rustic", "Smart", "Travel", "Vintage",
       "Eco", "Pro", "Mini", "Giant", "Soft", "Sturdy"]
NOUN = ["Mug", "Lamp", "Kettle", "Backpack", "Notebook", "Speaker", "Blanket", "Planter", "Chair", "Clock",
        "Bottle", "Basket", "Headphones", "Tent", "Brush", "Candle", "Jacket", "Scarf", "Puzzle", "Kite"]
WORDS = ["city", "council", "market", "river", "report", "season", "growth", "plan", "new", "record", "study", "team",
         "local", "global", "energy", "water", "school", "museum", "festival", "election", "budget", "coast",
         "island", "mountain", "storm", "harvest", "bridge", "library", "engineers", "researchers", "players",
         "voters", "travellers", "chefs", "artists", "doctors"]
PALETTE = ["#c0561f", "#2f6f8f", "#6a8f2f", "#8f2f6a", "#d4a017", "#3b2a20", "#1f7a5c", "#7a1f2b", "#4b4bb3",
           "#b34b4b", "#2b9aa8", "#9a6b2b"]


def _svg(i: int, rng: random.Random) -> str:
    """A small product-like illustration: a background, a few shapes, a label."""
    c1, c2, c3 = (rng.choice(PALETTE) for _ in range(3))
    shapes = []
    for _ in range(3 + i % 4):
        x, y, r = rng.randint(10, 86), rng.randint(10, 86), rng.randint(6, 22)
        if rng.random() < 0.5:
            shapes.append(f'<circle cx="{x}" cy="{y}" r="{r}" fill="{rng.choice(PALETTE)}" opacity=".8"/>')
        else:
            shapes.append(f'<rect x="{x - r}" y="{y - r}" width="{2 * r}" height="{r + 6}" rx="4" '
                          f'fill="{rng.choice(PALETTE)}" opacity=".8"/>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="96" height="96" viewBox="0 0 96 96">'
            f'<defs><linearGradient id="g{i}" x1="0" y1="0" x2="1" y2="1"><stop offset="0" stop-color="{c1}"/>'
            f'<stop offset="1" stop-color="{c2}"/></linearGradient></defs>'
            f'<rect width="96" height="96" rx="10" fill="url(#g{i})"/>{"".join(shapes)}'
            f'<text x="48" y="90" font-size="11" text-anchor="middle" fill="{c3}" font-family="sans-serif">'
            f'#{i:02d}</text></svg>\n')


def _png(i: int, rng: random.Random, size: int = 64) -> bytes:
    """A small RGB PNG (a two-colour gradient with stripes): compresses to a few KiB."""
    a = [int(rng.choice(PALETTE)[k:k + 2], 16) for k in (1, 3, 5)]
    b = [int(rng.choice(PALETTE)[k:k + 2], 16) for k in (1, 3, 5)]
    stripe = 4 + i % 9
    rows = []
    for y in range(size):
        row = bytearray([0])  # filter type 0 for each scanline
        for x in range(size):
            t = (x + y) / (2 * size - 2)
            px = [round(a[k] * (1 - t) + b[k] * t) for k in range(3)]
            if (x // stripe + y // stripe) % 2:
                px = [min(255, v + 40) for v in px]
            row += bytes(px)
        rows.append(bytes(row))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"".join(rows), 9))
            + chunk(b"IEND", b""))


def _sentence(rng: random.Random, n: int) -> str:
    words = [rng.choice(WORDS) for _ in range(n)]
    return " ".join(words).capitalize() + "."


def images() -> list[str]:
    """The image file names, relative to the heavy directory."""
    return [f"img/i{i:02d}.svg" for i in range(N_SVG)] + [f"img/p{i:02d}.png" for i in range(N_PNG)]


def products(rng: random.Random, imgs: list[str]) -> list[dict[str, object]]:
    """The shop's catalogue."""
    out = []
    for i in range(N_PRODUCTS):
        out.append({
            "id": f"h{i:03d}", "name": f"{rng.choice(ADJ)} {rng.choice(NOUN)} {i}",
            "category": CATEGORIES[i % len(CATEGORIES)], "price": round(rng.uniform(3, 240), 2),
            "was": round(rng.uniform(250, 300), 2) if rng.random() < 0.3 else None,
            "rating": round(rng.uniform(2.5, 5), 1), "reviews": rng.randint(0, 900),
            "image": imgs[i % len(imgs)], "desc": _sentence(rng, 14),
            "tags": rng.sample(["new", "sale", "eco", "gift", "bestseller", "limited", "bundle"], 3),
        })
    return out


def articles(rng: random.Random, imgs: list[str]) -> list[dict[str, object]]:
    """The news site's articles."""
    out = []
    for i in range(N_ARTICLES):
        out.append({
            "id": i, "section": SECTIONS[i % len(SECTIONS)], "title": _sentence(rng, 7)[:-1],
            "author": f"{rng.choice(['A.', 'B.', 'C.', 'D.', 'E.'])} {rng.choice(['Reyes', 'Novak', 'Osei', 'Lind'])}",
            "minutes": rng.randint(2, 14), "image": imgs[(i * 7) % len(imgs)],
            "summary": " ".join(_sentence(rng, 12) for _ in range(2)),
            "body": [_sentence(rng, 25) for _ in range(6)],
            "tags": rng.sample(SECTIONS, 3),
        })
    return out


def generate(out: Path) -> dict[str, int]:
    """Write the data and image files (HTML, JS and CSS are hand-written and committed); returns sizes."""
    rng = random.Random(20240611)
    (out / "img").mkdir(parents=True, exist_ok=True)
    (out / "data").mkdir(parents=True, exist_ok=True)
    for i in range(N_SVG):
        (out / "img" / f"i{i:02d}.svg").write_text(_svg(i, rng))
    for i in range(N_PNG):
        (out / "img" / f"p{i:02d}.png").write_bytes(_png(i, rng))
    imgs = images()
    (out / "data" / "products.json").write_text(json.dumps(products(rng, imgs), separators=(",", ":")))
    (out / "data" / "articles.json").write_text(json.dumps(articles(rng, imgs), separators=(",", ":")))
    return {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    sizes = generate(args.out)
    print(f"{len(sizes)} files, {sum(sizes.values()) / 1024:.0f} KiB in {args.out}")


if __name__ == "__main__":
    main()
