custom_imports = dict(
    imports=["json", "shardwise_test_not_installed_module"], allow_failed_imports=True
)
model = dict(type="Linear")
