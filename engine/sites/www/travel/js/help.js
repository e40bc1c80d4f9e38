// The help page is static; it only needs the shared header and footer.
Site.renderChrome("help");
