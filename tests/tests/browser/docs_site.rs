//! The docs site as `cargo xtask book` builds it into `target/book/`: at
//! the widths of a desktop window no table of any page is wider than the
//! column it sits in. mdBook would scroll such a table inside its column,
//! and a reader would see it cut off at the right edge.

use std::path::{Path, PathBuf};

use proxyfleet_tests::browser::Browser;

/// Desktop windows: a laptop's and a larger screen's.
const WIDTHS: [u32; 2] = [1280, 1600];

/// Each table of the page that does not fit its column, described.
const CLIPPED_TABLES: &str = r"
const column = document.querySelector('main').getBoundingClientRect();
const clipped = [];
document.querySelectorAll('main table').forEach((table, index) => {
  const box = table.parentElement;
  const edge = table.getBoundingClientRect();
  const scrolls = box.scrollWidth > box.clientWidth + 1;
  if (scrolls || edge.right > column.right + 1 || edge.right > window.innerWidth) {
    const head = table.querySelector('th');
    clipped.push(`table ${index + 1} (${head ? head.textContent : 'no header'}): ` +
      `${Math.round(edge.width)} px wide in a column of ${Math.round(column.width)} px`);
  }
});
return clipped;
";

/// The site's pages that hold a table (the SDK's rustdoc and the
/// all-in-one print page aside).
fn pages_with_tables(dir: &Path, pages: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the site's directory") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "sdk" {
                pages_with_tables(&path, pages);
            }
        } else if name.ends_with(".html")
            && name != "print.html"
            && std::fs::read_to_string(&path).is_ok_and(|html| html.contains("<table"))
        {
            pages.push(path);
        }
    }
}

#[tokio::test]
async fn no_table_of_the_docs_site_is_clipped_at_1280_or_1600_px() {
    let site = proxyfleet_tests::workspace_root().join("target/book");
    assert!(
        site.join("index.html").is_file(),
        "{} holds no site: run `cargo xtask book` (the README's test command builds it first)",
        site.display()
    );
    let mut pages = Vec::new();
    pages_with_tables(&site, &mut pages);
    pages.sort();
    assert!(
        pages.iter().any(|page| page.ends_with("kubernetes.html")),
        "the chart's values table is on kubernetes.html: {pages:?}"
    );
    let browser = Browser::start().await;
    let mut clipped = Vec::new();
    for width in WIDTHS {
        browser.set_width(width).await;
        for page in &pages {
            browser.goto(&format!("file://{}", page.display())).await;
            let found = browser.execute(CLIPPED_TABLES).await;
            for table in found.as_array().expect("a list") {
                let page = page.strip_prefix(&site).unwrap_or(page).display();
                clipped.push(format!("{width} px, {page}: {}", table.as_str().unwrap_or_default()));
            }
        }
    }
    browser.close().await;
    assert!(clipped.is_empty(), "tables cut off by their column:\n{}", clipped.join("\n"));
}
