app_name = "knowledge"

urlpatterns: list = []
