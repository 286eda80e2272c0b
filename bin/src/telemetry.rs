//! TEMPORARY STUB (replaced by the telemetry branch).
pub enum LogFormat {
    Plain,
    Json,
}
pub struct TelemetryGuard;
pub fn init_tracing(_f: LogFormat) -> anyhow::Result<TelemetryGuard> {
    Ok(TelemetryGuard)
}
pub struct MetricsHandle;
impl MetricsHandle {
    pub fn render(&self) -> String {
        String::new()
    }
}
pub fn install_metrics() -> anyhow::Result<MetricsHandle> {
    Ok(MetricsHandle)
}
