// The help page is static; it only needs the shared header and footer.
Shop.renderChrome("help");
