//! The bookkeeping of a corpus file's tables: what each `INSERT`, `UPDATE`
//! and `DELETE` changes, as Debezium change events for the table's topic.
//! DataFusion holds the rows in memory and evaluates the statements'
//! expressions; the answers the cases check are written in the files.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use datafusion::common::ScalarValue;
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::{FromTable, Statement, TableFactor, TableWithJoins};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;
use serde_json::{Map, Value, json};

/// A table of the file: its columns as declared, and its rows now.
pub struct Table {
    /// `name TYPE, ...` as the file declared them.
    pub columns: String,
    pub schema: SchemaRef,
}

/// What a statement did to the tables.
pub enum Done {
    /// A table was declared.
    Created(String),
    /// Change events for a table's topic.
    Changed(String, Vec<Value>),
    /// A view was declared: `(name, query)`.
    View(String, String),
}

/// The tables of one file, in memory.
pub struct Tables {
    ctx: SessionContext,
    pub tables: BTreeMap<String, Table>,
}

impl Tables {
    pub fn new() -> Self {
        Tables {
            ctx: SessionContext::new_with_config(
                datafusion::prelude::SessionConfig::new().with_target_partitions(1),
            ),
            tables: BTreeMap::new(),
        }
    }

    /// Apply one statement of the file.
    pub async fn apply(&mut self, sql: &str) -> Result<Done, String> {
        let statements = Parser::parse_sql(&GenericDialect {}, sql)
            .map_err(|e| format!("the runner cannot parse {sql:?}: {e}"))?;
        let [statement] = statements.as_slice() else {
            return Err(format!("one statement per record: {sql:?}"));
        };
        match statement {
            Statement::CreateTable(create) => {
                let name = create.name.to_string().to_lowercase();
                let columns = create
                    .columns
                    .iter()
                    .map(|c| format!("{} {}", c.name, c.data_type))
                    .collect::<Vec<_>>()
                    .join(", ");
                self.run(&format!("CREATE TABLE {name} ({columns})"))
                    .await?;
                let schema = self.table_schema(&name).await?;
                self.tables.insert(name.clone(), Table { columns, schema });
                Ok(Done::Created(name))
            }
            Statement::CreateView(view) => Ok(Done::View(
                view.name.to_string().to_lowercase(),
                view.query.to_string(),
            )),
            Statement::Insert(insert) => {
                let name = insert.table.to_string().to_lowercase();
                let before = self.rows(&name).await?;
                self.run(sql).await?;
                let after = self.rows(&name).await?;
                let added = bag_minus(&after, &before);
                Ok(Done::Changed(
                    name,
                    added
                        .into_iter()
                        .map(|r| event("c", None, Some(r)))
                        .collect(),
                ))
            }
            Statement::Delete(delete) => {
                let tables = match &delete.from {
                    FromTable::WithFromKeyword(t) | FromTable::WithoutKeyword(t) => t,
                };
                let name = single_table(tables)?;
                let condition = delete
                    .selection
                    .as_ref()
                    .map_or("TRUE".to_string(), |e| e.to_string());
                let hit = self
                    .query(&format!("SELECT * FROM {name} WHERE ({condition}) IS TRUE"))
                    .await?;
                let kept = self
                    .batches(&format!(
                        "SELECT * FROM {name} WHERE ({condition}) IS NOT TRUE"
                    ))
                    .await?;
                self.replace(&name, kept)?;
                Ok(Done::Changed(
                    name,
                    hit.into_iter().map(|r| event("d", Some(r), None)).collect(),
                ))
            }
            Statement::Update(update) => {
                let name = single_table(std::slice::from_ref(&update.table))?;
                let schema = self.tables[&name].schema.clone();
                let condition = update
                    .selection
                    .as_ref()
                    .map_or("TRUE".to_string(), |e| e.to_string());
                let mut set: BTreeMap<String, String> = BTreeMap::new();
                for a in &update.assignments {
                    set.insert(a.target.to_string().to_lowercase(), a.value.to_string());
                }
                let n = schema.fields().len();
                let new_columns = schema
                    .fields()
                    .iter()
                    .enumerate()
                    .map(|(i, f)| match set.get(&f.name().to_lowercase()) {
                        Some(e) => {
                            format!("CAST(({e}) AS {}) AS __new_{i}", sql_type(f.data_type()))
                        }
                        None => format!("{} AS __new_{i}", f.name()),
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                // Old and new values of each row in one pass, so they pair up.
                let both = self
                    .batches(&format!(
                        "SELECT *, {new_columns} FROM {name} WHERE ({condition}) IS TRUE"
                    ))
                    .await?;
                let old_batches: Vec<RecordBatch> = both
                    .iter()
                    .map(|b| b.project(&(0..n).collect::<Vec<_>>()))
                    .collect::<Result<_, _>>()
                    .map_err(|e| e.to_string())?;
                let new_batches: Vec<RecordBatch> = both
                    .iter()
                    .map(|b| RecordBatch::try_new(schema.clone(), b.columns()[n..].to_vec()))
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("{name}: SET gives another type: {e}"))?;
                let (old, new) = (rows_of(&old_batches)?, rows_of(&new_batches)?);
                let mut kept = self
                    .batches(&format!(
                        "SELECT * FROM {name} WHERE ({condition}) IS NOT TRUE"
                    ))
                    .await?;
                kept.extend(new_batches);
                self.replace(&name, kept)?;
                Ok(Done::Changed(
                    name,
                    old.into_iter()
                        .zip(new)
                        .map(|(b, a)| event("u", Some(b), Some(a)))
                        .collect(),
                ))
            }
            other => Err(format!("the runner does not know the statement {other}")),
        }
    }

    async fn run(&self, sql: &str) -> Result<(), String> {
        self.batches(sql).await.map(|_| ())
    }

    async fn batches(&self, sql: &str) -> Result<Vec<RecordBatch>, String> {
        let frame = self.ctx.sql(sql).await.map_err(|e| format!("{sql}: {e}"))?;
        frame.collect().await.map_err(|e| format!("{sql}: {e}"))
    }

    async fn query(&self, sql: &str) -> Result<Vec<Map<String, Value>>, String> {
        rows_of(&self.batches(sql).await?)
    }

    async fn rows(&self, table: &str) -> Result<Vec<Map<String, Value>>, String> {
        self.query(&format!("SELECT * FROM {table}")).await
    }

    async fn table_schema(&self, table: &str) -> Result<SchemaRef, String> {
        let t = self
            .ctx
            .table(table)
            .await
            .map_err(|e| format!("{table}: {e}"))?;
        Ok(Arc::new(t.schema().as_arrow().clone()))
    }

    fn replace(&mut self, name: &str, batches: Vec<RecordBatch>) -> Result<(), String> {
        let schema = self.tables[name].schema.clone();
        let batches = batches
            .into_iter()
            .map(|b| RecordBatch::try_new(schema.clone(), b.columns().to_vec()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{name}: {e}"))?;
        let table = MemTable::try_new(schema, vec![batches]).map_err(|e| e.to_string())?;
        self.ctx.deregister_table(name).map_err(|e| e.to_string())?;
        self.ctx
            .register_table(name, Arc::new(table))
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}

fn single_table(tables: &[TableWithJoins]) -> Result<String, String> {
    match tables {
        [t] if t.joins.is_empty() => match &t.relation {
            TableFactor::Table { name, .. } => Ok(name.to_string().to_lowercase()),
            other => Err(format!("the runner changes one table, not {other}")),
        },
        _ => Err("the runner changes one table at a time".into()),
    }
}

/// A Debezium change event.
fn event(op: &str, before: Option<Map<String, Value>>, after: Option<Map<String, Value>>) -> Value {
    json!({
        "before": before.map(Value::Object),
        "after": after.map(Value::Object),
        "op": op,
        "source": {"connector": "skein-sql-corpus"},
    })
}

/// Rows in `a` and not in `b`, as multisets.
fn bag_minus(a: &[Map<String, Value>], b: &[Map<String, Value>]) -> Vec<Map<String, Value>> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for r in b {
        *counts
            .entry(Value::Object(r.clone()).to_string())
            .or_default() += 1;
    }
    a.iter()
        .filter(|r| {
            let key = Value::Object((*r).clone()).to_string();
            match counts.get_mut(&key) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    false
                }
                _ => true,
            }
        })
        .cloned()
        .collect()
}

/// Rows as Debezium writes them: timestamps as milliseconds since the
/// epoch, the other values as JSON has them.
fn rows_of(batches: &[RecordBatch]) -> Result<Vec<Map<String, Value>>, String> {
    let mut rows = vec![];
    for b in batches {
        let columns: Vec<ArrayRef> = b
            .columns()
            .iter()
            .map(|c| match c.data_type() {
                DataType::Timestamp(_, _) => {
                    let ms = cast(c, &DataType::Timestamp(TimeUnit::Millisecond, None))?;
                    cast(&ms, &DataType::Int64)
                }
                _ => Ok(c.clone()),
            })
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        for r in 0..b.num_rows() {
            let mut row = Map::new();
            for (field, column) in b.schema().fields().iter().zip(&columns) {
                row.insert(field.name().clone(), json_value(column.as_ref(), r)?);
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

fn json_value(column: &dyn Array, row: usize) -> Result<Value, String> {
    if column.is_null(row) {
        return Ok(Value::Null);
    }
    let scalar = ScalarValue::try_from_array(column, row).map_err(|e| e.to_string())?;
    Ok(match scalar {
        ScalarValue::Boolean(Some(b)) => json!(b),
        ScalarValue::Int8(Some(v)) => json!(v),
        ScalarValue::Int16(Some(v)) => json!(v),
        ScalarValue::Int32(Some(v)) => json!(v),
        ScalarValue::Int64(Some(v)) => json!(v),
        ScalarValue::UInt8(Some(v)) => json!(v),
        ScalarValue::UInt16(Some(v)) => json!(v),
        ScalarValue::UInt32(Some(v)) => json!(v),
        ScalarValue::UInt64(Some(v)) => json!(v),
        ScalarValue::Float32(Some(v)) => json!(v),
        ScalarValue::Float64(Some(v)) => json!(v),
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => {
            json!(s)
        }
        other => return Err(format!("the runner cannot write {other:?} to a topic")),
    })
}

/// A column type in SQL, for a cast in an UPDATE.
fn sql_type(t: &DataType) -> &'static str {
    match t {
        DataType::Int8 | DataType::Int16 => "SMALLINT",
        DataType::Int32 => "INT",
        DataType::Int64 => "BIGINT",
        DataType::Float32 => "REAL",
        DataType::Float64 => "DOUBLE",
        DataType::Boolean => "BOOLEAN",
        DataType::Timestamp(_, _) => "TIMESTAMP",
        _ => "VARCHAR",
    }
}
