"""Include in the API v1 URL list: `path("", include("knowledge.api.urls"))`."""
from rest_framework.routers import SimpleRouter

from knowledge.api import views

router = SimpleRouter(trailing_slash=False)
router.register("datasets", views.DatasetViewSet, basename="dataset")
router.register("documents", views.DocumentViewSet, basename="document")

urlpatterns = [*router.urls]
