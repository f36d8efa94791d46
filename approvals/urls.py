app_name = "inbox"

urlpatterns: list = []
