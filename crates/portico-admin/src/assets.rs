//! The dashboard's files, embedded in the binary: plain ES modules and a stylesheet, with uPlot (MIT, from the
//! npm registry, committed under `assets/vendor/uplot` with its licence) for the charts. No build step, nothing
//! from another origin.

pub struct Asset {
    pub path: &'static str,
    pub content_type: &'static str,
    pub body: &'static [u8],
}

pub const ASSETS: &[Asset] = &[
    Asset { path: "/", content_type: "text/html; charset=utf-8", body: include_bytes!("../assets/index.html") },
    Asset {
        path: "/dashboard/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../assets/app.js"),
    },
    Asset {
        path: "/dashboard/style.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../assets/style.css"),
    },
    Asset {
        path: "/dashboard/vendor/uplot/uPlot.esm.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../assets/vendor/uplot/uPlot.esm.js"),
    },
    Asset {
        path: "/dashboard/vendor/uplot/uPlot.min.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../assets/vendor/uplot/uPlot.min.css"),
    },
    Asset {
        path: "/dashboard/vendor/uplot/LICENSE",
        content_type: "text/plain; charset=utf-8",
        body: include_bytes!("../assets/vendor/uplot/LICENSE"),
    },
    Asset { path: "/favicon.ico", content_type: "image/svg+xml", body: include_bytes!("../assets/favicon.svg") },
];

pub fn find(path: &str) -> Option<&'static Asset> {
    let path = if path == "/dashboard" || path == "/dashboard/" { "/" } else { path };
    ASSETS.iter().find(|a| a.path == path)
}
