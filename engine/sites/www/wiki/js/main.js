// Main page: only the shared chrome is dynamic; the boxes are static HTML.
Wiki.renderChrome();
