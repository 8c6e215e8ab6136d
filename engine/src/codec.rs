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

use crate::catalog::Catalog;
use crate::exec::{StageInput, StageInputExec};
use crate::lookup::exec::{LookupJoinExec, LookupSpec};
use crate::payload::ipc_bytes;

/// Encodes our nodes; decoding a lookup join opens its lookup, so it needs
/// the catalog of table kinds.
#[derive(Default)]
pub struct SkeinCodec {
    /// Reopens the sources and lookups a plan names; without it, they
    /// decode unopened.
    pub catalog: Option<Catalog>,
}

impl std::fmt::Debug for SkeinCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SkeinCodec")
    }
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum EncodedNode {
    StageInput {
        input: StageInput,
        /// Arrow IPC stream with the schema only: keeps field metadata.
        schema: Vec<u8>,
    },
    /// Its one input is the stream side.
    LookupJoin {
        spec: LookupSpec,
        table_schema: Vec<u8>,
    },
}

/// A schema as an Arrow IPC schema message.
pub fn schema_to_bytes(schema: &SchemaRef) -> DfResult<Vec<u8>> {
    ipc_bytes(schema, &[]).map_err(|e| DataFusionError::Internal(e.to_string()))
}

/// A schema from an Arrow IPC schema message.
pub fn schema_from_bytes(bytes: &[u8]) -> DfResult<SchemaRef> {
    let reader = StreamReader::try_new(Cursor::new(bytes), None)?;
    Ok(reader.schema())
}

impl PhysicalExtensionCodec for SkeinCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        _ctx: &TaskContext,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let node: EncodedNode = serde_json::from_slice(buf)
            .map_err(|e| DataFusionError::Internal(format!("plan node of ours: {e}")))?;
        match node {
            EncodedNode::StageInput { input, schema } => Ok(Arc::new(StageInputExec::new(
                input,
                schema_from_bytes(&schema)?,
            ))),
            EncodedNode::LookupJoin { spec, table_schema } => {
                let catalog = self.catalog.as_ref().ok_or_else(|| {
                    DataFusionError::Internal("a lookup join decoded without table kinds".into())
                })?;
                let [input] = inputs else {
                    return Err(DataFusionError::Internal(
                        "a lookup join has one input".into(),
                    ));
                };
                let handle = catalog
                    .open_lookup(spec, schema_from_bytes(&table_schema)?)
                    .map_err(|e| DataFusionError::Plan(e.to_string()))?;
                Ok(Arc::new(LookupJoinExec::try_new(
                    input.clone(),
                    Arc::new(handle),
                )?))
            }
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<()> {
        let encoded = if let Some(leaf) = node.downcast_ref::<StageInputExec>() {
            EncodedNode::StageInput {
                input: leaf.input.clone(),
                schema: schema_to_bytes(&leaf.schema())?,
            }
        } else if let Some(join) = node.downcast_ref::<LookupJoinExec>() {
            EncodedNode::LookupJoin {
                spec: join.handle.spec.clone(),
                table_schema: schema_to_bytes(&join.handle.table_schema)?,
            }
        } else {
            return Err(DataFusionError::NotImplemented(format!(
                "{} cannot be sent to a function",
                node.name()
            )));
        };
        buf.extend(
            serde_json::to_vec(&encoded).map_err(|e| DataFusionError::Internal(e.to_string()))?,
        );
        Ok(())
    }
}

/// A stage's sub-plan as datafusion-proto bytes, with our nodes.
pub fn plan_to_bytes(plan: Arc<dyn ExecutionPlan>) -> DfResult<Vec<u8>> {
    Ok(physical_plan_to_bytes_with_extension_codec(plan, &SkeinCodec::default())?.to_vec())
}

/// A stage's sub-plan back from datafusion-proto bytes.
pub fn plan_from_bytes(
    bytes: &[u8],
    ctx: &TaskContext,
    catalog: &Catalog,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    let codec = SkeinCodec {
        catalog: Some(catalog.clone()),
    };
    physical_plan_from_bytes_with_extension_codec(bytes, ctx, &codec)
}
