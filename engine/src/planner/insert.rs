//! `INSERT INTO sink <query>` planned as the query, then cast to the sink's
//! columns by position, where DataFusion's own INSERT planning refuses it.
//!
//! DataFusion 55 plans an INSERT's query with the target table's schema in
//! its context, and every `VALUES` inside the query (a side input joined
//! to the stream, NEXMark q13's) is then held to the table's width:
//! "Inconsistent data length across values list". The query alone plans;
//! the casts by position are what an INSERT without a column list means.

use std::sync::Arc;

use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{
    DmlStatement, Expr, ExprSchemable, LogicalPlan, LogicalPlanBuilder, WriteOp, col,
};
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::{DFParser, Statement as DfStatement};
use datafusion::sql::sqlparser::ast::{Statement, TableObject};

use crate::error::Result;

/// The INSERT of `sql` planned so, if `sql` is one `INSERT INTO table
/// <query>` without a column list; `None` otherwise.
pub(super) async fn by_position(ctx: &SessionContext, sql: &str) -> Result<Option<LogicalPlan>> {
    let Ok(mut statements) = DFParser::parse_sql(sql) else {
        return Ok(None);
    };
    let Some(DfStatement::Statement(statement)) = statements.pop_front() else {
        return Ok(None);
    };
    let Statement::Insert(insert) = *statement else {
        return Ok(None);
    };
    let (TableObject::TableName(table), Some(query), true) =
        (&insert.table, &insert.source, insert.columns.is_empty())
    else {
        return Ok(None);
    };
    let table = table.to_string();
    let provider = ctx.table_provider(table.as_str()).await?;
    let target = provider.schema();
    let input = ctx.state().create_logical_plan(&query.to_string()).await?;
    if input.schema().fields().len() != target.fields().len() {
        return Ok(None);
    }
    let exprs = input
        .schema()
        .columns()
        .into_iter()
        .zip(target.fields())
        .map(|(column, field)| {
            Ok(col(column)
                .cast_to(field.data_type(), input.schema())?
                .alias(field.name()))
        })
        .collect::<Result<Vec<Expr>>>()?;
    let projected = LogicalPlanBuilder::from(input).project(exprs)?.build()?;
    Ok(Some(LogicalPlan::Dml(DmlStatement::new(
        table.into(),
        provider_as_source(provider),
        WriteOp::Insert(InsertOp::Append),
        Arc::new(projected),
    ))))
}
