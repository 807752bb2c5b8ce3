// 在 require.js 之后、html-manager（embed-amd.js）之前加载；由 _config.yml 的 nb_ipywidgets_js 引入，
// 只出现在含小部件状态的页面上。本文件为本书自写（MIT），不是第三方代码。
(function () {
  // 1. embed-amd.js 里打包的每个 AMD 模块（html-manager 以及其中的 base、controls、output……）都按
  //    “自己的模块地址所在的目录”推算资源目录（webpack 的 publicPath），Font Awesome 图标字体的
  //    @font-face 地址就由它拼成。模块地址由 require.js 按模块名推出：不配置时是页面所在目录下的
  //    @jupyter-widgets/<名字>.js，字体于是指向 notebooks/@jupyter-widgets/… 而得到 404。
  //    这里把每个模块名都映射到本地副本的目录 _static/thirdparty/html-manager/（字体就在那里）。
  //    这些模块都在 embed-amd.js 里用具名 define 定义，require.js 不会真的去取 <名字>.js。
  var root = (document.documentElement.dataset && document.documentElement.dataset.content_root) || "";
  var local = root + "_static/thirdparty/html-manager";
  var modules = ["html-manager", "base", "base7", "controls", "controls7"];
  var paths = { "@jupyter-widgets/html-manager/dist": local };
  modules.forEach(function (name) { paths["@jupyter-widgets/" + name] = local + "/" + name; });
  if (window.require && window.require.config) {
    window.require.config({ paths: paths });
  }

  // 2. html-manager 按 MathJax 2 的接口（MathJax.Hub.Queue）给小部件标签排版公式，
  //    而本书用的是 MathJax 3。这里补一个很薄的兼容层，把请求转给 MathJax 3 的 typesetPromise。
  function ensureHub() {
    var mj = window.MathJax;
    if (!mj || mj.Hub) return;
    mj.Hub = {
      Queue: function () {
        Array.prototype.forEach.call(arguments, function (job) {
          if (!Array.isArray(job) || job[0] !== "Typeset") return;
          var el = job[2];
          var ready = (window.MathJax.startup && window.MathJax.startup.promise) || Promise.resolve();
          ready
            .then(function () {
              if (window.MathJax.typesetPromise) return window.MathJax.typesetPromise(el ? [el] : undefined);
            })
            .catch(function (err) { console.warn("MathJax typeset:", err); });
        });
      },
    };
  }
  ensureHub();
  document.addEventListener("DOMContentLoaded", ensureHub);
  window.addEventListener("load", ensureHub, { capture: true });
})();
