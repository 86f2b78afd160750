//! The error log: stderr through a non-blocking writer, as text for people (coloured only on a terminal) or as
//! one JSON object per line for machines (`log.format`).

use tracing_subscriber::EnvFilter;

/// Errors go through a non-blocking writer: a slow stderr must never stall a worker.
pub fn init(log: &portico_config::Log) -> tracing_appender::non_blocking::WorkerGuard {
    let (writer, guard) = tracing_appender::non_blocking(std::io::stderr());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&log.level));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer);
    let _ = match log.format {
        portico_config::LogFormat::Json => builder.event_format(JsonLines).try_init(),
        // Colour escapes are for a person at a terminal; in a file, a pipe or the journal they are noise.
        portico_config::LogFormat::Text => builder.with_target(false).with_ansi(wants_colour()).try_init(),
    };
    guard
}

/// Colour when stderr is a terminal, unless `NO_COLOR` is set (https://no-color.org).
fn wants_colour() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// `log.format: json`: one object per line, `{"timestamp", "level", "message", "fields": {...}}`, so a log
/// shipper needs no pattern to parse it (a multi-line message stays on its line, escaped).
struct JsonLines;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for JsonLines
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        use tracing_subscriber::fmt::time::FormatTime;
        let mut timestamp = String::new();
        tracing_subscriber::fmt::time::SystemTime
            .format_time(&mut tracing_subscriber::fmt::format::Writer::new(&mut timestamp))?;
        let mut fields = JsonFields::default();
        event.record(&mut fields);
        let level = event.metadata().level().as_str().to_ascii_lowercase();
        // Written key by key: the time first, as a person reading the file expects (a JSON map would sort them).
        writeln!(
            writer,
            "{{\"timestamp\":{},\"level\":{},\"message\":{},\"fields\":{}}}",
            serde_json::Value::from(timestamp),
            serde_json::Value::from(level),
            serde_json::Value::from(fields.message),
            serde_json::Value::Object(fields.fields)
        )
    }
}

/// An event's message and its other fields, as JSON values of their own types where they have one.
#[derive(Default)]
struct JsonFields {
    message: String,
    fields: serde_json::Map<String, serde_json::Value>,
}

impl JsonFields {
    fn put(&mut self, field: &tracing::field::Field, value: serde_json::Value) {
        self.fields.insert(field.name().to_string(), value);
    }
}

impl tracing::field::Visit for JsonFields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            _ => self.put(field, format!("{value:?}").into()),
        }
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match field.name() {
            "message" => self.message = value.to_string(),
            _ => self.put(field, value.into()),
        }
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.put(field, value.into());
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.put(field, value.into());
    }
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.put(field, value.into());
    }
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.put(field, value.into());
    }
    fn record_error(&mut self, field: &tracing::field::Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, value.to_string().into());
    }
}
