// The "Every key" sections show a schema's source, whose comments explain each key: open it, rather than
// leave it folded under "Source code in ..." as mkdocstrings does for source listings.
document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("details.mkdocstrings-source").forEach((listing) => { listing.open = true; });
});
