//! `portico demo`: three built-in backends on loopback behind a round-robin load balancer, with a static
//! route, a redirect, an in-process handler and a filter to show the other targets, and the MQTT broker (on its
//! own listener, and over WebSocket at `/mqtt`).

use crate::demo_backend;
use anyhow::{anyhow, Context};

pub fn run(listen: &str, workers: &str, admin: &str, mqtt: &str) -> anyhow::Result<()> {
    let backends = ["alpha", "beta", "gamma"]
        .iter()
        .map(|name| demo_backend::start(name).with_context(|| format!("cannot start demo backend {name}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let endpoints: String = backends.iter().map(|b| format!("      - address: {}\n", b.addr)).collect();
    let (function, gate) = demo_functions()?;
    let (function, gate) = (function.display(), gate.display());
    // A token made for this run, so the dashboard's actions (drain, enable) can be tried: it asks for it.
    let token = demo_token();
    let admin_line = match admin {
        "off" => String::new(),
        address => format!("admin: {{ address: \"{address}\", token: \"{token}\" }}"),
    };
    let (mqtt_listener, mqtt_route) = match mqtt {
        "off" => (String::new(), String::new()),
        address => (
            format!("\n  - name: mqtt\n    address: {address}\n    protocol: mqtt"),
            // The same broker over WebSocket, on the HTTP listener (mqtt.js, paho-mqtt's websockets transport).
            "\n  - match: { path: /mqtt }\n    mqtt: websocket".to_string(),
        ),
    };
    let yaml = format!(
        "workers: {workers}
{admin_line}
listeners:
  - name: demo
    address: {listen}{mqtt_listener}
filters:
  - headers: {{ response: {{ set: {{ x-served-by: portico-demo }} }} }}
routes:
  - match: {{ path: /healthz }}
    static: {{ body: \"ok\\n\" }}
  - match: {{ path: /old/*rest }}
    redirect: {{ to: \"/{{rest}}\", status: 301 }}
  - match: {{ path: /whoami }}
    handler: echo{mqtt_route}
  - match: {{ path_prefix: /fn/hello }}
    function: hello
  - match: {{ path_prefix: /api/ }}
    cluster: demo
    filters:
      - rewrite: {{ strip_prefix: /api }}
      - function: api_key
  - match: {{ path_prefix: / }}
    cluster: demo
functions:
  hello: {{ source: \"{function}\", env: {{ GREETING: hello }} }}
  api_key: {{ source: \"{gate}\", env: {{ DEMO_KEY: demo }} }}
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
    eprintln!("      curl 'http://{listen}/fn/hello?name=you'   (a JavaScript function, {function})");
    eprintln!(
        "      curl -H 'x-api-key: demo' http://{listen}/api/echo   (a JavaScript filter checks the key first, {gate})"
    );
    if admin != "off" {
        eprintln!("      http://{admin}/   in a browser: the dashboard (its actions ask for the admin token {token})");
        eprintln!("      curl http://{admin}/metrics   (the admin API: also /admin/clusters, /admin/config)");
    }
    if let Some((host, port)) = (mqtt != "off").then(|| mqtt.rsplit_once(':')).flatten() {
        eprintln!("      mosquitto_sub -h {host} -p {port} -t 'demo/#' -v   (the MQTT broker; in another terminal:)");
        eprintln!("      mosquitto_pub -h {host} -p {port} -t demo/hello -m 'hello, MQTT'");
        eprintln!(
            "      MQTT over WebSocket: ws://{listen}/mqtt (subprotocol mqtt: mqtt.js, paho-mqtt, MQTT Explorer)"
        );
    }
    eprintln!("Stop with Ctrl-C.\n");
    crate::lifecycle::serve(loaded, None)
}

/// The demo's JavaScript functions, written to files of their own in the temporary directory: a target and a
/// filter.
fn demo_functions() -> anyhow::Result<(std::path::PathBuf, std::path::PathBuf)> {
    const HELLO: &str = r#"// Portico demo function: docs/functions.md
export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    const name = url.searchParams.get("name") || "world";
    return Response.json({ message: `${env.GREETING}, ${name}!`, method: request.method, path: url.pathname });
  },
};
"#;
    const API_KEY: &str = r#"// Portico demo filter: docs/functions.md, "Functions as filters"
export default {
  onRequest(request, env) {
    if (request.headers.get("x-api-key") !== env.DEMO_KEY) {
      return Response.json({ error: "send the header x-api-key: demo" }, { status: 401 });
    }
    request.headers.delete("x-api-key");
    request.headers.set("x-api-client", "demo");
  },
};
"#;
    let dir = std::env::temp_dir().join(format!("portico-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let write = |name: &str, text: &str| -> anyhow::Result<std::path::PathBuf> {
        let file = dir.join(name);
        std::fs::write(&file, text).with_context(|| format!("cannot write {}", file.display()))?;
        Ok(file)
    };
    Ok((write("hello.js", HELLO)?, write("api_key.js", API_KEY)?))
}

/// `portico demo -c FILE`: serves FILE, after making the certificates it names and does not have (see
/// `demo_certs`) and starting a demo backend on each endpoint of its clusters that
/// is a loopback address nothing listens on, so that an example answers as written. Endpoints elsewhere,
/// over HTTPS or of `protocol: h2` clusters are left as they are (the stand-ins speak plain HTTP/1).
pub fn run_config(path: &std::path::Path) -> anyhow::Result<()> {
    eprintln!("Portico demo of {}:", path.display());
    // Certificates it names but does not have yet are made first (a file that does not load is reported below).
    if let Ok(unchecked) = portico_config::load_file(path) {
        for file in crate::demo_certs::make_missing(&unchecked)? {
            eprintln!("  made {} (signed by a throw-away demo CA)", file.display());
        }
    }
    let loaded = crate::lifecycle::load_checked(path)?;
    let mut started = Vec::new();
    for (cluster, settings) in &loaded.config.clusters {
        for (i, endpoint) in settings.endpoints.iter().enumerate() {
            let Ok((scheme, host_port)) = portico_config::parse_endpoint(&endpoint.address) else {
                continue;
            };
            let ip = match (host_port.ip, host_port.host.as_str()) {
                (Some(ip), _) => ip,
                (None, "localhost") => std::net::IpAddr::from([127, 0, 0, 1]),
                (None, _) => continue,
            };
            let address = std::net::SocketAddr::new(ip, host_port.port);
            let plain = scheme != portico_config::EndpointScheme::Https
                && settings.protocol != portico_config::UpstreamProtocol::H2;
            if !ip.is_loopback() || !plain {
                eprintln!("  {cluster}: {} left alone (not a plain HTTP/1 loopback endpoint)", endpoint.address);
                continue;
            }
            let name = format!("{cluster}-{i}");
            match demo_backend::start_on(address, &name) {
                Ok(backend) => {
                    eprintln!("  {cluster}: demo backend {name} at http://{address}/");
                    started.push(backend);
                }
                Err(e) => eprintln!("  {cluster}: {} left alone ({e})", endpoint.address),
            }
        }
    }
    for l in &loaded.config.listeners {
        // `0.0.0.0:8080` is reached as `127.0.0.1:8080`.
        let reach = l.address.replace("0.0.0.0:", "127.0.0.1:").replace("[::]:", "[::1]:");
        let scheme = if l.tls.is_some() { "https" } else { "http" };
        match reach.rsplit_once(':') {
            Some((host, port)) if l.protocol == portico_config::ListenerProtocol::Mqtt => {
                let tls = if l.tls.is_some() { " --cafile CA.pem" } else { "" };
                eprintln!("Try:  mosquitto_sub -h {host} -p {port}{tls} -t '#' -v   (MQTT listener {})", l.name);
            }
            _ => eprintln!("Try:  curl {scheme}://{reach}/"),
        }
    }
    if let Some(admin) = &loaded.config.admin {
        eprintln!("      curl http://{}/admin/clusters   (the admin API)", admin.address);
    }
    eprintln!("Stop with Ctrl-C.\n");
    let served = crate::lifecycle::serve(loaded, Some(path.to_path_buf()));
    drop(started);
    served
}

/// 16 random bytes as hex, from the kernel: the demo's admin token.
fn demo_token() -> String {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if read.is_err() {
        // No /dev/urandom: a token from the clock and the pid, still unguessable enough for a loopback demo.
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        bytes = (now ^ u128::from(std::process::id()) << 64).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
