//! Where a stage's output goes: executing the bound plan, then the sink, one
//! function, or a group by the consistent-hash ring.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::physical_plan::ExecutionPlan;
use futures::future::try_join_all;

use super::{StageFunction, StageOutput};
use crate::context::{NextHop, function_name};
use crate::error::Result;
use crate::invoke::{InvocationType, invoke_counting_retries};
use crate::lookup::set_aside::SetAside;
use crate::payload::{ASYNC_PAYLOAD_LIMIT, PayloadHeader, SYNC_PAYLOAD_LIMIT, encode_payloads};
use crate::sink::{SinkConfig, SinkRows, SinkWrite};

impl StageFunction {
    /// Execute the bound plan and send its output on.
    pub(super) async fn run_and_route(
        &self,
        output: &StageOutput,
        plan: Arc<dyn ExecutionPlan>,
        header: PayloadHeader,
    ) -> Result<u64> {
        let ran = self.execute_setting_aside(&plan).await?;
        self.send_output(output, &plan, header, ran).await
    }

    /// Send what [`Self::execute_setting_aside`] computed of `plan` on,
    /// its side output first; the rows sent.
    pub(super) async fn send_output(
        &self,
        output: &StageOutput,
        plan: &Arc<dyn ExecutionPlan>,
        header: PayloadHeader,
        (outputs, set_aside): (Vec<Vec<RecordBatch>>, Arc<SetAside>),
    ) -> Result<u64> {
        let rows: u64 = outputs.iter().flatten().map(|b| b.num_rows() as u64).sum();
        // Rows a lookup join set aside leave before the output does, so an
        // epoch that commits has sent them.
        set_aside
            .send(&self.name, header.epoch, &header.offsets)
            .await?;
        self.route(output, header, Some((plan.schema(), outputs)))
            .await?;
        Ok(rows)
    }

    /// Send output (per output partition) to the next hop; `None` sends the
    /// metadata-only payloads that let downstream counts complete.
    pub(super) async fn route(
        &self,
        output: &StageOutput,
        header: PayloadHeader,
        rows: Option<(SchemaRef, Vec<Vec<RecordBatch>>)>,
    ) -> Result<()> {
        let (schema, parts) = match rows {
            Some((s, p)) => (s, p),
            None => (output.plan.schema(), vec![]),
        };
        match &output.next {
            NextHop::Sink(config) => {
                let batches = parts.into_iter().flatten().collect();
                self.write_sink(config, &header, &schema, batches).await
            }
            NextHop::Single { stage } => {
                let batches: Vec<RecordBatch> = parts.into_iter().flatten().collect();
                self.send(*stage, 0, &header, &schema, batches).await
            }
            NextHop::Group { stage, members } => {
                let ring = output.ring.as_ref().expect("group hop has a ring");
                let mut per_member: Vec<Vec<RecordBatch>> = vec![vec![]; *members as usize];
                for (partition, batches) in parts.into_iter().enumerate() {
                    per_member[ring.member_for(partition)].extend(batches);
                }
                try_join_all(
                    per_member
                        .into_iter()
                        .enumerate()
                        .map(|(m, batches)| self.send(*stage, m as u32, &header, &schema, batches)),
                )
                .await
                .map(|_| ())
            }
        }
    }

    /// Write one epoch's rows to the sink, typed once (appended rows or
    /// changes), watched and counted.
    async fn write_sink(
        &self,
        config: &SinkConfig,
        header: &PayloadHeader,
        schema: &SchemaRef,
        batches: Vec<RecordBatch>,
    ) -> Result<()> {
        let out = self.sink.as_ref().expect("sink stage has a sink");
        let (schema, rows) = SinkRows::from_stage(schema, batches)?;
        let n = rows.num_rows();
        let written = self
            .watched_sink_write(out, || {
                out.sink.write(SinkWrite {
                    query: &self.ctx.query_code,
                    run: &self.ctx.run,
                    epoch: header.epoch,
                    member: self.ctx.member,
                    schema: schema.clone(),
                    rows: rows.clone(),
                    offsets: header.offsets.clone(),
                    last: header.last,
                })
            })
            .await;
        crate::metrics::sink_write(&config.kind, n, written.is_ok());
        if written.is_ok() {
            crate::crash_point::after_sink_write(header.epoch, n);
        }
        if let Err(e) = &written {
            self.tally.count(|t| t.sink_errors += 1);
            let text = crate::error::one_line(e);
            self.tally
                .measure(|l| l.reason("sink error", &config.kind, text));
        }
        written
    }

    async fn send(
        &self,
        stage: u32,
        member: u32,
        header: &PayloadHeader,
        schema: &SchemaRef,
        batches: Vec<RecordBatch>,
    ) -> Result<()> {
        let kind = if self.ctx.invoke_async {
            InvocationType::Async
        } else {
            InvocationType::Sync
        };
        let limit = match kind {
            InvocationType::Sync => SYNC_PAYLOAD_LIMIT,
            InvocationType::Async => ASYNC_PAYLOAD_LIMIT,
        };
        let payloads = encode_payloads(header, schema, &batches, limit)?;
        let target = function_name(&self.ctx.query_code, stage, member);
        for p in payloads {
            let bytes = p.to_json();
            let sent = bytes.len();
            crate::metrics::invocation(stage, sent);
            let call = invoke_counting_retries(
                self.env.invoker.as_ref(),
                &target,
                bytes,
                kind,
                self.env.max_backoff,
                50,
            );
            let (answer, retries) = match kind {
                InvocationType::Sync => crate::usage::waiting_on_callee(call).await?,
                InvocationType::Async => call.await?,
            };
            crate::usage::count_callee(sent, &answer);
            self.tally.measure(|l| {
                l.bytes_out += sent as u64;
                l.retries += u64::from(retries);
            });
        }
        Ok(())
    }
}
