//! datafusion-proto extension codec for our own plan nodes, and the helpers
//! that turn a stage's sub-plan into bytes and back.

use std::io::Cursor;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
};
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use serde::{Deserialize, Serialize};

use crate::exec::{StageInput, StageInputExec};
use crate::payload::ipc_bytes;

#[derive(Debug, Default)]
pub struct SkeinCodec;

#[derive(Serialize, Deserialize)]
struct EncodedStageInput {
    input: StageInput,
    /// Arrow IPC stream with the schema only: keeps field metadata.
    schema: Vec<u8>,
}

pub fn schema_to_bytes(schema: &SchemaRef) -> DfResult<Vec<u8>> {
    ipc_bytes(schema, &[]).map_err(|e| DataFusionError::Internal(e.to_string()))
}

pub fn schema_from_bytes(bytes: &[u8]) -> DfResult<SchemaRef> {
    let reader = StreamReader::try_new(Cursor::new(bytes), None)?;
    Ok(reader.schema())
}

impl PhysicalExtensionCodec for SkeinCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        _inputs: &[Arc<dyn ExecutionPlan>],
        _ctx: &TaskContext,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let node: EncodedStageInput = serde_json::from_slice(buf)
            .map_err(|e| DataFusionError::Internal(format!("stage input node: {e}")))?;
        let schema = schema_from_bytes(&node.schema)?;
        Ok(Arc::new(StageInputExec::new(node.input, schema)))
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<()> {
        let Some(leaf) = node.downcast_ref::<StageInputExec>() else {
            return Err(DataFusionError::NotImplemented(format!(
                "{} cannot be sent to a function",
                node.name()
            )));
        };
        let encoded = EncodedStageInput {
            input: leaf.input.clone(),
            schema: schema_to_bytes(&leaf.schema())?,
        };
        buf.extend(
            serde_json::to_vec(&encoded).map_err(|e| DataFusionError::Internal(e.to_string()))?,
        );
        Ok(())
    }
}

pub fn plan_to_bytes(plan: Arc<dyn ExecutionPlan>) -> DfResult<Vec<u8>> {
    Ok(physical_plan_to_bytes_with_extension_codec(plan, &SkeinCodec)?.to_vec())
}

pub fn plan_from_bytes(bytes: &[u8], ctx: &TaskContext) -> DfResult<Arc<dyn ExecutionPlan>> {
    physical_plan_from_bytes_with_extension_codec(bytes, ctx, &SkeinCodec)
}
