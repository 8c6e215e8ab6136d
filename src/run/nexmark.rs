//! The NEXMark queries (queries/nexmark/), built into the binary so that an
//! installed `skein` runs them anywhere, over the built-in generator.

use anyhow::{Context, Result};

/// The NEXMark tables over the built-in generator, then query N; q10's
/// files go to the default output.
pub fn nexmark_sql(query: u32, events: u64, rate: u64, sources: usize) -> Result<String> {
    let output = format!(
        "file://{}",
        std::env::temp_dir().join("skein-nexmark-q10").display()
    );
    nexmark_sql_to(query, events, rate, sources, &output)
}

/// The NEXMark queries, built into the binary so that an installed `skein`
/// runs them anywhere.
const NEXMARK_QUERIES: [&str; 23] = [
    include_str!("../../queries/nexmark/q0.sql"),
    include_str!("../../queries/nexmark/q1.sql"),
    include_str!("../../queries/nexmark/q2.sql"),
    include_str!("../../queries/nexmark/q3.sql"),
    include_str!("../../queries/nexmark/q4.sql"),
    include_str!("../../queries/nexmark/q5.sql"),
    include_str!("../../queries/nexmark/q6.sql"),
    include_str!("../../queries/nexmark/q7.sql"),
    include_str!("../../queries/nexmark/q8.sql"),
    include_str!("../../queries/nexmark/q9.sql"),
    include_str!("../../queries/nexmark/q10.sql"),
    include_str!("../../queries/nexmark/q11.sql"),
    include_str!("../../queries/nexmark/q12.sql"),
    include_str!("../../queries/nexmark/q13.sql"),
    include_str!("../../queries/nexmark/q14.sql"),
    include_str!("../../queries/nexmark/q15.sql"),
    include_str!("../../queries/nexmark/q16.sql"),
    include_str!("../../queries/nexmark/q17.sql"),
    include_str!("../../queries/nexmark/q18.sql"),
    include_str!("../../queries/nexmark/q19.sql"),
    include_str!("../../queries/nexmark/q20.sql"),
    include_str!("../../queries/nexmark/q21.sql"),
    include_str!("../../queries/nexmark/q22.sql"),
];

/// [`nexmark_sql`] with the location a query writing files (q10) writes to.
pub fn nexmark_sql_to(
    query: u32,
    events: u64,
    rate: u64,
    sources: usize,
    output: &str,
) -> Result<String> {
    let body = NEXMARK_QUERIES
        .get(query as usize)
        .with_context(|| format!("NEXMark query {query}: there are q0 to q22"))?
        .replace("{{output}}", output);
    let tables = skein_generators::table::nexmark_ddl(events, rate, sources);
    Ok(format!("{tables}\n{body}"))
}
