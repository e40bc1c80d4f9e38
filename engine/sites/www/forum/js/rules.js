// The rules page is static; it only needs the shared header and footer.
Forum.renderChrome("rules");
