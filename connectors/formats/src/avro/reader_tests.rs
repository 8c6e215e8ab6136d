use super::*;

#[test]
fn named_types_defined_in_skipped_fields_are_inlined() {
    let writer: Value = serde_json::from_str(
        r#"{"type":"record","name":"R","namespace":"n","fields":[
            {"name":"kind","type":{"type":"enum","name":"Kind","symbols":["A","B"]}},
            {"name":"id","type":"long"},
            {"name":"other","type":"Kind"}]}"#,
    )
    .unwrap();
    let other = Field::new("other", datafusion::arrow::datatypes::DataType::Utf8, true);
    let id = Field::new("ID", datafusion::arrow::datatypes::DataType::Int64, false);
    let missing = Field::new("gone", datafusion::arrow::datatypes::DataType::Int64, true);
    let (reader, positions) = select_fields(&writer, &[&other, &id, &missing]).unwrap();
    assert_eq!(positions, [Some(0), Some(1), None]);
    let fields = reader["fields"].as_array().unwrap();
    assert_eq!(
        fields[0]["type"]["symbols"][1], "B",
        "Kind is defined where it is used"
    );
    assert_eq!(reader["namespace"], "n");
    // The reader parses and resolves against the writer.
    let plan = Plan::new(1, &writer.to_string(), &[&other, &id, &missing]).unwrap();
    assert!(matches!(plan.columns[2], Fill::Null));

    let not_null = Field::new("gone", datafusion::arrow::datatypes::DataType::Int64, false);
    let err = Plan::new(1, &writer.to_string(), &[&not_null]).unwrap_err();
    assert!(err.contains("column gone is NOT NULL"), "{err}");
    let err = select_fields(&serde_json::json!("long"), &[&id]).unwrap_err();
    assert!(err.contains("not a record"), "{err}");
}
