//! `portico demo`: three built-in backends on loopback behind a round-robin load balancer, with a static
//! route, a redirect, an in-process handler and a filter to show the other targets.

use crate::demo_backend;
use anyhow::{anyhow, Context};

pub fn run(listen: &str, workers: &str) -> anyhow::Result<()> {
    let backends = ["alpha", "beta", "gamma"]
        .iter()
        .map(|name| demo_backend::start(name).with_context(|| format!("cannot start demo backend {name}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let endpoints: String = backends.iter().map(|b| format!("      - address: {}\n", b.addr)).collect();
    let yaml = format!(
        "workers: {workers}
listeners:
  - name: demo
    address: {listen}
filters:
  - headers: {{ response: {{ set: {{ x-served-by: portico-demo }} }} }}
routes:
  - match: {{ path: /healthz }}
    static: {{ body: \"ok\\n\" }}
  - match: {{ path: /old/*rest }}
    redirect: {{ to: \"/{{rest}}\", status: 301 }}
  - match: {{ path: /whoami }}
    handler: echo
  - match: {{ path_prefix: / }}
    cluster: demo
clusters:
  demo:
    balancer: round_robin
    endpoints:
{endpoints}"
    );
    let loaded = portico_config::load_str(&yaml, "<demo>").map_err(|e| anyhow!("{e}"))?;
    eprintln!("Portico demo: load balancer on http://{listen}/ in front of:");
    for b in &backends {
        eprintln!("  {} at http://{}/", b.name, b.addr);
    }
    eprintln!("Try:  curl http://{listen}/          (again: the next backend answers)");
    eprintln!("      curl http://{listen}/echo      (what the backend received)");
    eprintln!("      curl http://{listen}/healthz   (a static response from Portico itself)");
    eprintln!("      curl -i http://{listen}/old/echo  (a redirect to /echo)");
    eprintln!(
        "      curl http://{listen}/whoami    (Portico's own echo handler: the request as it would be forwarded)"
    );
    eprintln!("Stop with Ctrl-C.\n");
    crate::lifecycle::serve(loaded, None)
}
